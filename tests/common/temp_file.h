// A path under the system temp directory, unique to this process, removed (file or directory tree)
// when the object is destroyed: tests leave nothing behind, also when they fail or throw. A
// function-local static TempFile lives until the process exits (one file shared by a binary's tests).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kvtier::test {

class TempFile {
 public:
  // <temp dir>/<prefix>_<pid><suffix>
  TempFile(const std::string& prefix, const std::string& suffix)
      : path_(std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + suffix)) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ~TempFile() {
    std::error_code ec;  // best effort: a destructor must not throw
    std::filesystem::remove_all(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kvtier::test
