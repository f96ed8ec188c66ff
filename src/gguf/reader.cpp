#include "gguf/reader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/checked_math.h"
#include "core/error.h"

namespace kvtier::gguf {
namespace {

// A bounds-checked little-endian cursor over the file image.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }

  template <typename... Args>
  [[noreturn]] void error_at(uint64_t at, fmt::format_string<Args...> f, Args&&... args) const {
    fail(ErrorKind::kInvalidFile, "{}: at byte {}: {}", name_, at,
         fmt::format(f, std::forward<Args>(args)...));
  }

  template <typename T>
  T read(std::string_view what) {
    if (left() < sizeof(T)) {
      error_at(pos_, "file ends while reading {} ({} bytes needed, {} left)", what, sizeof(T), left());
    }
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what);
    if (len > left()) {
      error_at(at, "{} has length {} but only {} bytes are left in the file", what, len, left());
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  const uint8_t* take(uint64_t n) {
    KVTIER_ASSERT(n <= left());
    const uint8_t* p = bytes_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

Value read_value(Cursor& c, ValueType type, const std::string& key, int depth);

Array read_array(Cursor& c, const std::string& key, int depth) {
  const uint64_t at = c.pos();
  if (depth >= kMaxArrayNesting) {
    c.error_at(at, "metadata '{}': arrays nested deeper than {} levels", key, kMaxArrayNesting);
  }
  const uint32_t type_id = c.read<uint32_t>("array element type");
  const auto elem = value_type_from_id(type_id);
  if (!elem) c.error_at(at, "metadata '{}': unknown array element type {}", key, type_id);
  const uint64_t count_at = c.pos();
  const uint64_t count = c.read<uint64_t>("array length");
  Array a;
  a.elem_type = *elem;
  a.count = count;
  // Each element needs at least this many bytes: reject impossible counts before allocating.
  const uint64_t min_elem = *elem == ValueType::kString  ? 8
                            : *elem == ValueType::kArray ? 12
                                                         : value_type_size(*elem);
  const auto need = checked_mul(count, min_elem);
  if (!need || *need > c.left()) {
    c.error_at(count_at, "metadata '{}': array of {} {} elements does not fit in the {} bytes left", key,
               count, value_type_name(*elem), c.left());
  }
  if (*elem == ValueType::kString) {
    a.strings.reserve(count);
    for (uint64_t i = 0; i < count; ++i) a.strings.push_back(c.read_string("array string"));
  } else if (*elem == ValueType::kArray) {
    a.arrays.reserve(count);
    for (uint64_t i = 0; i < count; ++i) a.arrays.push_back(Value::array(read_array(c, key, depth + 1)));
  } else {
    const uint8_t* p = c.take(*need);
    a.raw.assign(p, p + *need);
  }
  return a;
}

Value read_value(Cursor& c, ValueType type, const std::string& key, int depth) {
  switch (type) {
    case ValueType::kU8:
      return Value::u8(c.read<uint8_t>("u8 value"));
    case ValueType::kI8:
      return Value::i8(c.read<int8_t>("i8 value"));
    case ValueType::kU16:
      return Value::u16(c.read<uint16_t>("u16 value"));
    case ValueType::kI16:
      return Value::i16(c.read<int16_t>("i16 value"));
    case ValueType::kU32:
      return Value::u32(c.read<uint32_t>("u32 value"));
    case ValueType::kI32:
      return Value::i32(c.read<int32_t>("i32 value"));
    case ValueType::kF32:
      return Value::f32(c.read<float>("f32 value"));
    case ValueType::kBool:
      return Value::boolean(c.read<uint8_t>("bool value") != 0);
    case ValueType::kString:
      return Value::string(c.read_string("string value"));
    case ValueType::kArray:
      return Value::array(read_array(c, key, depth));
    case ValueType::kU64:
      return Value::u64(c.read<uint64_t>("u64 value"));
    case ValueType::kI64:
      return Value::i64(c.read<int64_t>("i64 value"));
    case ValueType::kF64:
      return Value::f64(c.read<double>("f64 value"));
  }
  KVTIER_ASSERT(false);
  __builtin_unreachable();
}

}  // namespace

Content parse(std::span<const uint8_t> bytes, const std::string& name) {
  Cursor c(bytes, name);
  Content out;

  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    c.error_at(0, "not a GGUF file (magic {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 \"GGUF\")",
               magic & 0xff, (magic >> 8) & 0xff, (magic >> 16) & 0xff, magic >> 24);
  }
  out.version = c.read<uint32_t>("version");
  if (out.version == 1) c.error_at(4, "GGUF version 1 is obsolete and not supported (need 2 or 3)");
  if (out.version != 2 && out.version != 3) {
    if ((out.version & 0xffff) == 0 && out.version != 0) {
      c.error_at(4, "big-endian GGUF files are not supported (version field 0x{:08x})", out.version);
    }
    c.error_at(4, "unsupported GGUF version {} (supported: 2, 3)", out.version);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Minimal encoded sizes: a KV is >= 8 (key length) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > c.left() / 13)
    c.error_at(16, "metadata count {} cannot fit in a file of {} bytes", n_kv, bytes.size());
  if (n_tensors > c.left() / 24) {
    c.error_at(8, "tensor count {} cannot fit in a file of {} bytes", n_tensors, bytes.size());
  }

  out.metadata.reserve(n_kv);
  std::unordered_map<std::string, uint64_t> seen_keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    out.kv_offsets.push_back(at);
    std::string key = c.read_string("metadata key");
    if (key.empty()) c.error_at(at, "metadata entry {} has an empty key", i);
    if (auto [it, inserted] = seen_keys.emplace(key, at); !inserted) {
      c.error_at(at, "duplicate metadata key '{}' (first at byte {})", key, it->second);
    }
    const uint64_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>("metadata value type");
    const auto type = value_type_from_id(type_id);
    if (!type) c.error_at(type_at, "metadata '{}': unknown value type {}", key, type_id);
    Value v = read_value(c, *type, key, 0);
    out.metadata.push_back({std::move(key), std::move(v)});
  }

  for (const auto& kv : out.metadata) {
    if (kv.key != "general.alignment") continue;
    const auto a = kv.value.as_int();
    if (kv.value.type != ValueType::kU32 || !a || *a == 0 || (*a & (*a - 1)) != 0) {
      fail(ErrorKind::kInvalidFile, "{}: general.alignment must be a u32 power of two, got {} {}", name,
           value_type_name(kv.value.type), a ? std::to_string(*a) : std::string("(not an integer)"));
    }
    out.alignment = static_cast<uint32_t>(*a);
  }

  out.tensors.reserve(n_tensors);
  std::unordered_map<std::string, uint64_t> seen_tensors;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    out.tensor_info_offsets.push_back(at);
    TensorInfo t;
    t.name = c.read_string("tensor name");
    if (auto [it, inserted] = seen_tensors.emplace(t.name, at); !inserted) {
      c.error_at(at, "duplicate tensor name '{}' (first at byte {})", t.name, it->second);
    }
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims > kMaxDims)
      c.error_at(at, "tensor '{}' has {} dimensions (at most {})", t.name, n_dims, kMaxDims);
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne > static_cast<uint64_t>(INT64_MAX))
        c.error_at(at, "tensor '{}' dimension {} is {}", t.name, d, ne);
      const auto prod = checked_mul(n, ne);
      if (!prod || *prod > static_cast<uint64_t>(INT64_MAX)) {
        c.error_at(at, "tensor '{}': element count overflows", t.name);
      }
      n = *prod;
      t.ne.push_back(ne);
    }
    t.n_elements = n;
    const uint64_t type_at = c.pos();
    const uint32_t type_id = c.read<uint32_t>("tensor type");
    const auto traits = ggml_type_traits(type_id);
    if (!traits) c.error_at(type_at, "tensor '{}' has unknown GGML type id {}", t.name, type_id);
    t.type = traits->type;
    const uint64_t row = t.ne.empty() ? 1 : t.ne[0];
    if (row % traits->block_size != 0) {
      c.error_at(at, "tensor '{}': row length {} is not a multiple of the {} block size {}", t.name, row,
                 traits->name, traits->block_size);
    }
    const auto nbytes = checked_mul(n / traits->block_size, traits->type_size);
    if (!nbytes) c.error_at(at, "tensor '{}': byte size overflows", t.name);
    t.n_bytes = *nbytes;
    const uint64_t off_at = c.pos();
    t.offset = c.read<uint64_t>("tensor data offset");
    if (t.offset % out.alignment != 0) {
      c.error_at(off_at, "tensor '{}': data offset {} is not a multiple of the alignment {}", t.name,
                 t.offset, out.alignment);
    }
    out.tensors.push_back(std::move(t));
  }

  out.header_end = c.pos();
  const auto data_offset = checked_align_up(c.pos(), out.alignment);
  if (!data_offset) c.error_at(c.pos(), "data section offset overflows");
  out.data_offset = *data_offset;
  if (!out.tensors.empty() && out.data_offset > bytes.size()) {
    c.error_at(c.pos(), "file ends before its data section (needs {} bytes, has {})", out.data_offset,
               bytes.size());
  }
  const uint64_t data_size = out.data_offset <= bytes.size() ? bytes.size() - out.data_offset : 0;

  for (auto& t : out.tensors) {
    const auto end = checked_add(t.offset, t.n_bytes);
    if (!end || *end > data_size) {
      fail(ErrorKind::kInvalidFile,
           "{}: tensor '{}' ({} bytes at data offset {}) extends past the end of the file (data section has "
           "{} "
           "bytes)",
           name, t.name, t.n_bytes, t.offset, data_size);
    }
    t.data = bytes.data() + out.data_offset + t.offset;
  }

  // No two tensors may share bytes.
  std::vector<size_t> order(out.tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return out.tensors[a].offset < out.tensors[b].offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& prev = out.tensors[order[i - 1]];
    const auto& cur = out.tensors[order[i]];
    if (prev.n_bytes > 0 && cur.n_bytes > 0 && prev.offset + prev.n_bytes > cur.offset) {
      fail(ErrorKind::kInvalidFile, "{}: tensors '{}' and '{}' overlap (data offsets {} + {} bytes and {})",
           name, prev.name, cur.name, prev.offset, prev.n_bytes, cur.offset);
    }
  }
  return out;
}

File::File(const std::string& path) : map_(std::make_unique<MappedFile>(path)) {
  content_ = parse(map_->bytes(), path);
  for (size_t i = 0; i < content_.metadata.size(); ++i) kv_index_.emplace(content_.metadata[i].key, i);
  for (size_t i = 0; i < content_.tensors.size(); ++i) tensor_index_.emplace(content_.tensors[i].name, i);
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &content_.metadata[it->second].value;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &content_.tensors[it->second];
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, std::string_view want,
                             const Value& v) {
  fail(ErrorKind::kInvalidFile, "{}: metadata '{}' should be {} but is {}", path, key, want,
       value_type_name(v.type));
}
}  // namespace

std::optional<std::string> File::opt_string(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* s = v->as_string()) return *s;
  wrong_type(path(), key, "a string", *v);
}

std::optional<int64_t> File::opt_int(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto i = v->as_int()) return i;
  wrong_type(path(), key, "an integer", *v);
}

std::optional<double> File::opt_float(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto d = v->as_number()) return d;
  wrong_type(path(), key, "a number", *v);
}

std::optional<bool> File::opt_bool(std::string_view key) const {
  const Value* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (auto b = v->as_bool()) return b;
  wrong_type(path(), key, "a bool", *v);
}

std::string File::get_string(std::string_view key) const {
  auto v = opt_string(key);
  if (!v) fail(ErrorKind::kInvalidFile, "{}: required metadata '{}' is missing", path(), key);
  return *v;
}

int64_t File::get_int(std::string_view key) const {
  auto v = opt_int(key);
  if (!v) fail(ErrorKind::kInvalidFile, "{}: required metadata '{}' is missing", path(), key);
  return *v;
}

double File::get_float(std::string_view key) const {
  auto v = opt_float(key);
  if (!v) fail(ErrorKind::kInvalidFile, "{}: required metadata '{}' is missing", path(), key);
  return *v;
}

}  // namespace kvtier::gguf
