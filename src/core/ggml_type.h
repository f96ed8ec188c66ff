// GGML tensor element types: ids as stored in GGUF files, block sizes and bytes per block.
// Every type GGML defines is known here by name and size, including those no kernel computes yet;
// whether a backend can compute a type is the backend's business.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kvtier {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  // 4 and 5 were Q4_2 and Q4_3, removed from GGML.
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  // 31..33 were Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (repacked layouts), removed from files.
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  // 36..38 were IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8, removed from files.
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;  // as GGML spells it: "f32", "q4_K", ...
  uint32_t block_size;    // elements per block
  uint32_t type_size;     // bytes per block
};

// Traits of a type id read from a file; nullopt for ids GGML does not define.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
// Traits of a known type (always succeeds).
const GgmlTypeTraits& ggml_traits(GgmlType type);
std::string_view ggml_type_name(GgmlType type);
std::optional<GgmlType> ggml_type_from_name(std::string_view name);  // case-insensitive
std::span<const GgmlTypeTraits> ggml_all_types();

// Bytes of a row of n elements; nullopt if n is not a multiple of the block size or on overflow.
std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n);

}  // namespace kvtier
