// GGUF writer: metadata in insertion order, tensors streamed one at a time from fill callbacks, so
// files larger than memory (an 8B model) can be written. Files are written to a private
// `<path>.tmp.<pid>.<id>` and renamed into place only when complete: a failed write (disk full, I/O error)
// leaves nothing behind.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "gguf/value.h"

namespace kvtier::gguf {

// Fills a tensor's bytes ([n_bytes], the GGML block layout of its type).
using TensorFill = std::function<void(std::span<uint8_t> dst)>;
// Called after each tensor is written: (tensors done, tensors total, bytes written so far).
using WriteProgress = std::function<void(size_t, size_t, uint64_t)>;

class Writer {
 public:
  explicit Writer(uint32_t version = 3) : version_(version) {}

  // Sets a metadata value; a key set twice keeps its first position and takes the new value.
  void set(const std::string& key, Value value);
  // Adds a tensor; ne is fastest-varying first. Throws Error(kInvalidArgument) on a bad shape.
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, TensorFill fill);
  void add_tensor_bytes(std::string name, GgmlType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);

  uint32_t alignment() const;
  // Total size of the file that write() produces.
  uint64_t file_size() const;

  // Writes the file atomically; throws Error(kIo) naming the path on failure.
  void write(const std::string& path, const WriteProgress& progress = {}) const;
  // The whole file in memory (for tests and small files).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t n_bytes;
    TensorFill fill;
  };
  std::vector<uint8_t> header() const;  // everything before the data section, padded
  template <typename Sink>
  void emit(Sink& sink, const WriteProgress& progress) const;

  uint32_t version_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace kvtier::gguf
