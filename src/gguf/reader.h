// GGUF reader: parses and validates a whole GGUF (v2, v3) file over an mmap.
//
// File layout (little-endian):
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x      { string key | u32 value_type | value }
//   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment (default 32) | tensor data (offsets relative to here)
// where string = u64 length + bytes, array = u32 elem_type + u64 count + elements.
//
// Everything is validated before use (counts and lengths against the bytes left, overflow in every
// size computation, tensor shapes, types, alignment, bounds and overlaps, duplicate names); a bad
// file raises Error(kInvalidFile) naming the file, the byte offset and the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ggml_type.h"
#include "core/mapped_file.h"
#include "gguf/value.h"

namespace kvtier::gguf {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayNesting = 8;

struct KeyValue {
  std::string key;
  Value value;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> ne;  // [n_dims], fastest-varying first (GGML order)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the parsed buffer

  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(n_bytes)}; }
};

// The parsed content; tensor data pointers refer to the buffer that was parsed.
struct Content {
  uint32_t version = 0;
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // absolute file offset of the data section
  std::vector<KeyValue> metadata;
  std::vector<TensorInfo> tensors;
  // Byte offsets where each section entry starts (for diagnostics and mutation tests).
  std::vector<uint64_t> kv_offsets;           // [n_kv]
  std::vector<uint64_t> tensor_info_offsets;  // [n_tensors]
  uint64_t header_end = 0;                    // end of the last tensor info, before padding
};

// Parses a whole file image; `name` is used in error messages.
Content parse(std::span<const uint8_t> bytes, const std::string& name);

class File {
 public:
  // Maps and parses `path`; throws Error (kIo or kInvalidFile).
  explicit File(const std::string& path);

  const std::string& path() const { return map_->path(); }
  uint64_t file_size() const { return map_->size(); }
  // MappedFile::drop_pages of a range of this file's bytes (a tensor's data copied elsewhere).
  void drop_pages(std::span<const uint8_t> range) const { map_->drop_pages(range); }
  uint32_t version() const { return content_.version; }
  uint32_t alignment() const { return content_.alignment; }
  uint64_t data_offset() const { return content_.data_offset; }
  const std::vector<KeyValue>& metadata() const { return content_.metadata; }
  const std::vector<TensorInfo>& tensors() const { return content_.tensors; }
  const Content& content() const { return content_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed lookups. The get_* forms throw Error(kInvalidFile) naming the key when it is missing or
  // of the wrong type; the opt_* forms return nullopt when missing and throw when of the wrong type.
  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::optional<std::string> opt_string(std::string_view key) const;
  std::optional<int64_t> opt_int(std::string_view key) const;
  std::optional<double> opt_float(std::string_view key) const;
  std::optional<bool> opt_bool(std::string_view key) const;

 private:
  std::unique_ptr<MappedFile> map_;
  Content content_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace kvtier::gguf
