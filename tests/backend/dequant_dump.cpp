// Test helper: writes our f32 dequantisation of one tensor of a GGUF file to stdout as raw
// little-endian f32, optionally only rows [row_begin, row_end) (a row = ne[0] elements).
// Usage: dequant_dump MODEL.gguf TENSOR_NAME [ROW_BEGIN ROW_END]
//        dequant_dump --raw TYPE     (reads blocks of TYPE, e.g. q3_K, from stdin)
// Used by test_dequant_models.py, which compares it with the gguf Python package.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cpu/dequant.h"
#include "core/error.h"
#include "gguf/reader.h"

namespace {

int dump_raw(const char* type_name) {
  const auto type = kvtier::ggml_type_from_name(type_name);
  if (!type) {
    std::fprintf(stderr, "unknown type '%s'\n", type_name);
    return 2;
  }
  const std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(std::cin), {});
  const auto& traits = kvtier::ggml_traits(*type);
  if (bytes.size() % traits.type_size != 0) {
    std::fprintf(stderr, "input is not a whole number of blocks\n");
    return 2;
  }
  const int64_t n = static_cast<int64_t>(bytes.size() / traits.type_size * traits.block_size);
  std::vector<float> out(static_cast<size_t>(n));  // [n] f32
  kvtier::cpu::dequantize_row(*type, bytes.data(), out.data(), n);
  return std::fwrite(out.data(), 4, out.size(), stdout) == out.size() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--raw") {
    try {
      return dump_raw(argv[2]);
    } catch (const kvtier::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (argc != 3 && argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf TENSOR [ROW_BEGIN ROW_END]\n", argv[0]);
    return 2;
  }
  try {
    kvtier::gguf::File file(argv[1]);
    const kvtier::gguf::TensorInfo* t = file.find_tensor(argv[2]);
    if (t == nullptr) {
      std::fprintf(stderr, "no tensor '%s'\n", argv[2]);
      return 2;
    }
    const int64_t ne0 = static_cast<int64_t>(t->ne[0]);
    const int64_t n_rows = static_cast<int64_t>(t->n_elements) / ne0;
    const uint64_t row_bytes = t->n_bytes / static_cast<uint64_t>(n_rows);
    int64_t r0 = 0, r1 = n_rows;
    if (argc == 5) {
      r0 = std::stoll(argv[3]);
      r1 = std::stoll(argv[4]);
    }
    if (r0 < 0 || r1 > n_rows || r0 > r1) {
      std::fprintf(stderr, "bad row range\n");
      return 2;
    }
    std::vector<float> row(static_cast<size_t>(ne0));  // [ne0] f32
    for (int64_t r = r0; r < r1; ++r) {
      kvtier::cpu::dequantize_row(t->type, t->data + r * row_bytes, row.data(), ne0);
      if (std::fwrite(row.data(), 4, row.size(), stdout) != row.size()) return 1;
    }
  } catch (const kvtier::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
