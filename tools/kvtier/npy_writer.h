// Writes a 2-D f32 .npy file row by row (the row count is filled in when it is closed).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

namespace kvtier::cli {

class NpyWriter {
 public:
  NpyWriter(const std::string& path, int64_t n_cols);
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  void append(std::span<const float> row);
  // Rewrites the header with the final shape and closes; throws Error(kIo) on failure.
  void close();

 private:
  void write_header();
  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t n_cols_;
  int64_t n_rows_ = 0;
};

}  // namespace kvtier::cli
