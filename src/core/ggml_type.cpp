#include "core/ggml_type.h"

#include <cctype>

#include "core/checked_math.h"
#include "core/error.h"

namespace kvtier {
namespace {

constexpr uint32_t kQK = 32;    // block of the legacy quant types
constexpr uint32_t kQKK = 256;  // super-block of the K / IQ quant types

// Sizes follow GGML's block structs (scales as f16 unless noted).
constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::kF32, "f32", 1, 4},
    {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", kQK, 2 + kQK / 2},
    {GgmlType::kQ4_1, "q4_1", kQK, 4 + kQK / 2},
    {GgmlType::kQ5_0, "q5_0", kQK, 2 + 4 + kQK / 2},
    {GgmlType::kQ5_1, "q5_1", kQK, 4 + 4 + kQK / 2},
    {GgmlType::kQ8_0, "q8_0", kQK, 2 + kQK},
    {GgmlType::kQ8_1, "q8_1", kQK, 4 + kQK},
    {GgmlType::kQ2_K, "q2_K", kQKK, kQKK / 16 + kQKK / 4 + 4},
    {GgmlType::kQ3_K, "q3_K", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2},
    {GgmlType::kQ4_K, "q4_K", kQKK, 4 + 12 + kQKK / 2},
    {GgmlType::kQ5_K, "q5_K", kQKK, 4 + 12 + kQKK / 8 + kQKK / 2},
    {GgmlType::kQ6_K, "q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2},
    {GgmlType::kQ8_K, "q8_K", kQKK, 4 + kQKK + kQKK / 16 * 2},
    {GgmlType::kIQ2_XXS, "iq2_xxs", kQKK, 2 + kQKK / 4},
    {GgmlType::kIQ2_XS, "iq2_xs", kQKK, 2 + kQKK / 4 + kQKK / 32},
    {GgmlType::kIQ3_XXS, "iq3_xxs", kQKK, 2 + 3 * kQKK / 8},
    {GgmlType::kIQ1_S, "iq1_s", kQKK, 2 + kQKK / 8 + kQKK / 16},
    {GgmlType::kIQ4_NL, "iq4_nl", kQK, 2 + kQK / 2},
    {GgmlType::kIQ3_S, "iq3_s", kQKK, 2 + kQKK / 4 + kQKK / 32 + kQKK / 8 + kQKK / 64},
    {GgmlType::kIQ2_S, "iq2_s", kQKK, 2 + kQKK / 4 + kQKK / 32 + kQKK / 32},
    {GgmlType::kIQ4_XS, "iq4_xs", kQKK, 2 + 2 + kQKK / 64 + kQKK / 2},
    {GgmlType::kI8, "i8", 1, 1},
    {GgmlType::kI16, "i16", 1, 2},
    {GgmlType::kI32, "i32", 1, 4},
    {GgmlType::kI64, "i64", 1, 8},
    {GgmlType::kF64, "f64", 1, 8},
    {GgmlType::kIQ1_M, "iq1_m", kQKK, kQKK / 8 + kQKK / 16 + kQKK / 32},
    {GgmlType::kBF16, "bf16", 1, 2},
    {GgmlType::kTQ1_0, "tq1_0", kQKK, (kQKK - 4 * kQKK / 64) / 5 + kQKK / 64 + 2},
    {GgmlType::kTQ2_0, "tq2_0", kQKK, kQKK / 4 + 2},
    {GgmlType::kMXFP4, "mxfp4", kQK, 1 + kQK / 2},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

std::span<const GgmlTypeTraits> ggml_all_types() {
  return kTypes;
}

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : ggml_all_types()) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) {
  for (const auto& t : ggml_all_types()) {
    if (t.type == type) return t;
  }
  KVTIER_ASSERT(false, "unknown GgmlType {}", static_cast<uint32_t>(type));
  __builtin_unreachable();
}

std::string_view ggml_type_name(GgmlType type) {
  return ggml_traits(type).name;
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const auto& t : ggml_all_types()) {
    if (iequals(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n) {
  const auto& t = ggml_traits(type);
  if (n % t.block_size != 0) return std::nullopt;
  return checked_mul(n / t.block_size, t.type_size);
}

}  // namespace kvtier
