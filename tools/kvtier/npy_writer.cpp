#include "npy_writer.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kvtier::cli {
namespace {
constexpr size_t kHeaderBytes = 128;  // magic, version, length, dict padded with spaces, '\n'
}

NpyWriter::NpyWriter(const std::string& path, int64_t n_cols) : path_(path), n_cols_(n_cols) {
  f_ = std::fopen(path.c_str(), "wb");
  if (f_ == nullptr) fail(ErrorKind::kIo, "cannot create '{}'", path);
  write_header();
}

NpyWriter::~NpyWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void NpyWriter::write_header() {
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", n_rows_, n_cols_);
  dict.resize(kHeaderBytes - 10 - 1, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += '\x01';
  h += '\x00';
  const auto len = static_cast<uint16_t>(dict.size());
  h += static_cast<char>(len & 0xff);
  h += static_cast<char>(len >> 8);
  h += dict;
  if (std::fseek(f_, 0, SEEK_SET) != 0 || std::fwrite(h.data(), 1, h.size(), f_) != h.size())
    fail(ErrorKind::kIo, "cannot write '{}'", path_);
}

void NpyWriter::append(std::span<const float> row) {
  if (std::fwrite(row.data(), sizeof(float), row.size(), f_) != row.size())
    fail(ErrorKind::kIo, "cannot write '{}'", path_);
  ++n_rows_;
}

void NpyWriter::close() {
  if (f_ == nullptr) return;
  write_header();
  const int rc = std::fclose(f_);
  f_ = nullptr;
  if (rc != 0) fail(ErrorKind::kIo, "cannot write '{}'", path_);
}

}  // namespace kvtier::cli
