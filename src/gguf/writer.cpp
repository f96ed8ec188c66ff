#include "gguf/writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "core/checked_math.h"
#include "core/error.h"
#include "gguf/reader.h"

namespace kvtier::gguf {
namespace {

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    append(&v, sizeof(T));
  }
  void append(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }
  void put_raw(const std::vector<uint8_t>& r) { append(r.data(), r.size()); }
  void pad_to(uint64_t align) {
    while (out_.size() % align != 0) out_.push_back(0);
  }
  std::vector<uint8_t>& vec() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

void put_array_body(Bytes& b, const Array& a);

void put_value_body(Bytes& b, const Value& v) {
  switch (v.type) {
    case ValueType::kU8:
      b.put(static_cast<uint8_t>(std::get<uint64_t>(v.data)));
      break;
    case ValueType::kI8:
      b.put(static_cast<int8_t>(std::get<int64_t>(v.data)));
      break;
    case ValueType::kU16:
      b.put(static_cast<uint16_t>(std::get<uint64_t>(v.data)));
      break;
    case ValueType::kI16:
      b.put(static_cast<int16_t>(std::get<int64_t>(v.data)));
      break;
    case ValueType::kU32:
      b.put(static_cast<uint32_t>(std::get<uint64_t>(v.data)));
      break;
    case ValueType::kI32:
      b.put(static_cast<int32_t>(std::get<int64_t>(v.data)));
      break;
    case ValueType::kF32:
      b.put(static_cast<float>(std::get<double>(v.data)));
      break;
    case ValueType::kBool:
      b.put(static_cast<uint8_t>(std::get<bool>(v.data) ? 1 : 0));
      break;
    case ValueType::kString:
      b.put_string(std::get<std::string>(v.data));
      break;
    case ValueType::kArray:
      put_array_body(b, std::get<Array>(v.data));
      break;
    case ValueType::kU64:
      b.put(std::get<uint64_t>(v.data));
      break;
    case ValueType::kI64:
      b.put(std::get<int64_t>(v.data));
      break;
    case ValueType::kF64:
      b.put(std::get<double>(v.data));
      break;
  }
}

void put_array_body(Bytes& b, const Array& a) {
  b.put(static_cast<uint32_t>(a.elem_type));
  b.put<uint64_t>(a.count);
  if (a.elem_type == ValueType::kString) {
    KVTIER_ASSERT(a.strings.size() == a.count);
    for (const auto& s : a.strings) b.put_string(s);
  } else if (a.elem_type == ValueType::kArray) {
    KVTIER_ASSERT(a.arrays.size() == a.count);
    for (const auto& v : a.arrays) put_array_body(b, std::get<Array>(v.data));
  } else {
    KVTIER_ASSERT(a.raw.size() == a.count * value_type_size(a.elem_type));
    b.put_raw(a.raw);
  }
}

uint64_t padded(uint64_t n, uint32_t align) {
  return (n + align - 1) / align * align;
}

class FileSink {
 public:
  FileSink(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    if (f_ == nullptr) fail(ErrorKind::kIo, "{}: cannot create: {}", path, std::strerror(errno));
  }
  ~FileSink() {
    if (f_ != nullptr) std::fclose(f_);
  }
  void write(const uint8_t* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) {
      fail(ErrorKind::kIo, "{}: write failed: {}", path_, std::strerror(errno));
    }
  }
  void close() {
    const bool flush_ok = std::fflush(f_) == 0;
    const int err = errno;
    const bool close_ok = std::fclose(f_) == 0;
    f_ = nullptr;
    if (!flush_ok || !close_ok) fail(ErrorKind::kIo, "{}: write failed: {}", path_, std::strerror(err));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

class VectorSink {
 public:
  void write(const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); }
  std::vector<uint8_t> out;
};

}  // namespace

void Writer::set(const std::string& key, Value value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, TensorFill fill) {
  if (ne.size() > kMaxDims) fail(ErrorKind::kInvalidArgument, "tensor '{}': {} dimensions", name, ne.size());
  for (const auto& t : tensors_) {
    if (t.name == name) fail(ErrorKind::kInvalidArgument, "tensor '{}' added twice", name);
  }
  uint64_t n = 1;
  for (uint64_t d : ne) {
    auto p = checked_mul(n, d);
    if (!p) fail(ErrorKind::kInvalidArgument, "tensor '{}': element count overflows", name);
    n = *p;
  }
  const auto& tr = ggml_traits(type);
  const uint64_t row = ne.empty() ? 1 : ne[0];
  if (row % tr.block_size != 0) {
    fail(ErrorKind::kInvalidArgument, "tensor '{}': row of {} is not a multiple of the {} block size {}",
         name, row, tr.name, tr.block_size);
  }
  const uint64_t n_bytes = n / tr.block_size * tr.type_size;
  tensors_.push_back({std::move(name), type, std::move(ne), n_bytes, std::move(fill)});
}

void Writer::add_tensor_bytes(std::string name, GgmlType type, std::vector<uint64_t> ne,
                              std::vector<uint8_t> data) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(data));
  add_tensor(std::move(name), type, std::move(ne), [shared](std::span<uint8_t> dst) {
    KVTIER_ASSERT(dst.size() == shared->size(), "tensor data of {} bytes for {}", shared->size(), dst.size());
    std::memcpy(dst.data(), shared->data(), dst.size());
  });
}

uint32_t Writer::alignment() const {
  for (const auto& [k, v] : kv_) {
    if (k == "general.alignment") {
      auto a = v.as_int();
      KVTIER_ASSERT(a && *a > 0 && (*a & (*a - 1)) == 0, "general.alignment must be a power of two");
      return static_cast<uint32_t>(*a);
    }
  }
  return kDefaultAlignment;
}

std::vector<uint8_t> Writer::header() const {
  const uint32_t align = alignment();
  Bytes b;
  b.put(kMagic);
  b.put(version_);
  b.put<uint64_t>(tensors_.size());
  b.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    b.put_string(k);
    b.put(static_cast<uint32_t>(v.type));
    put_value_body(b, v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    b.put_string(t.name);
    b.put(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) b.put(d);
    b.put(static_cast<uint32_t>(t.type));
    b.put(offset);
    offset += padded(t.n_bytes, align);
  }
  b.pad_to(align);
  return std::move(b.vec());
}

uint64_t Writer::file_size() const {
  uint64_t size = header().size();
  for (const auto& t : tensors_) size += padded(t.n_bytes, alignment());
  return size;
}

template <typename Sink>
void Writer::emit(Sink& sink, const WriteProgress& progress) const {
  const uint32_t align = alignment();
  const auto head = header();
  sink.write(head.data(), head.size());
  uint64_t written = head.size();
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    const uint64_t n = padded(t.n_bytes, align);
    buf.assign(n, 0);
    t.fill(std::span<uint8_t>(buf.data(), t.n_bytes));
    sink.write(buf.data(), buf.size());
    written += n;
    if (progress) progress(i + 1, tensors_.size(), written);
  }
}

void Writer::write(const std::string& path, const WriteProgress& progress) const {
  // A private temporary name: two writers of the same path must not share one.
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(reinterpret_cast<uintptr_t>(this));
  try {
    FileSink sink(tmp);
    emit(sink, progress);
    sink.close();
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::kIo, "{}: cannot rename {} into place: {}", path, tmp, ec.message());
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  VectorSink sink;
  emit(sink, {});
  return std::move(sink.out);
}

}  // namespace kvtier::gguf
