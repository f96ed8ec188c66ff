// A read-only memory map of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kvtier {

class MappedFile {
 public:
  // Throws Error(kIo) naming the path and the system's reason when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  // Hands the whole pages inside `range` (a part of bytes()) back to the kernel: they leave the
  // process's resident set and are read from the file again if touched. For data copied elsewhere.
  void drop_pages(std::span<const uint8_t> range) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvtier
