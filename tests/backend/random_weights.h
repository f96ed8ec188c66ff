// Test helpers: random rows of every supported weight type, and their dequantised companions.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/blocks.h"
#include "backend/cpu/dequant.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "core/ggml_type.h"
#include "core/half.h"
#include "core/quantize_ref.h"

namespace kvtier::cpu::test {

inline const std::vector<GgmlType>& all_weight_types() {
  static const std::vector<GgmlType> types = {
      GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
      GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
      GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};
  return types;
}

// Byte offsets of the f16 scale fields of each block layout (random bits there could be inf/nan).
inline std::vector<int> f16_field_offsets(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Bytes of the quant fields of types with a min/offset term: zeroing them leaves only the offset,
// so dequantising the zeroed block gives each element's offset term (for error bounds).
struct ByteRange {
  int begin = 0, end = 0;
};
inline ByteRange quant_bytes_of_min_types(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_1:
      return {4, 20};
    case GgmlType::kQ5_1:
      return {4, 24};
    case GgmlType::kQ2_K:
      return {16, 80};
    case GgmlType::kQ4_K:
      return {16, 144};
    case GgmlType::kQ5_K:
      return {16, 176};
    default:
      return {0, 0};
  }
}

// n_rows rows of k elements: floats from N(0,1) (rounded to the type for f16/bf16), quantised types
// as random block bytes with N(0, 0.05) f16 scales.
inline std::vector<uint8_t> random_weights(GgmlType type, int64_t n_rows, int64_t k, std::mt19937& rng) {
  const auto& tr = ggml_traits(type);
  const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(type, static_cast<uint64_t>(k)));
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(n_rows));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  if (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = 0; r < n_rows; ++r) {
      for (float& v : row) v = normal(rng);
      quantize_row_ref(type, row, std::span<uint8_t>(out.data() + r * row_bytes, row_bytes));
    }
    return out;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  const size_t n_blocks = out.size() / tr.type_size;
  for (size_t b = 0; b < n_blocks; ++b) {
    for (int off : f16_field_offsets(type)) {
      const uint16_t h = f32_to_f16(0.05f * normal(rng));
      std::memcpy(out.data() + b * tr.type_size + off, &h, 2);
    }
  }
  return out;
}

// Per-element offset terms of a row (zero for types without one), see quant_bytes_of_min_types.
inline std::vector<float> offset_terms(GgmlType type, const uint8_t* row, int64_t k) {
  std::vector<float> out(static_cast<size_t>(k), 0.0f);
  const ByteRange q = quant_bytes_of_min_types(type);
  if (q.end == 0) return out;
  const auto& tr = ggml_traits(type);
  const size_t bytes = static_cast<size_t>(k / tr.block_size) * tr.type_size;
  std::vector<uint8_t> z(row, row + bytes);
  for (size_t b = 0; b < bytes / tr.type_size; ++b) {
    std::memset(z.data() + b * tr.type_size + q.begin, 0, static_cast<size_t>(q.end - q.begin));
  }
  dequantize_row(type, z.data(), out.data(), k);
  return out;
}

// Dequantised activation row (exact in double: d * q): act in format f, x the f32 row it came from.
inline std::vector<double> act_values(ActFormat f, const uint8_t* act, const std::vector<float>& x) {
  std::vector<double> out(x.size());
  if (f == ActFormat::kF32) {
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i];
  } else if (f == ActFormat::kQ8_32 || f == ActFormat::kQ8_32Min) {
    for (size_t b = 0; b < x.size() / kQK; ++b) {
      ActQ8_32 a;
      std::memcpy(&a, act + b * sizeof(a), sizeof(a));
      for (int i = 0; i < kQK; ++i) out[b * kQK + i] = static_cast<double>(a.d) * a.qs[i];
    }
  } else {
    for (size_t b = 0; b < x.size() / kQKK; ++b) {
      ActQ8_K a;
      std::memcpy(&a, act + b * sizeof(a), sizeof(a));
      for (int i = 0; i < kQKK; ++i) out[b * kQKK + i] = static_cast<double>(a.d) * a.qs[i];
    }
  }
  return out;
}

// matmul of n_tokens rows of x on `threads` threads: [n_tokens, w.n_rows] f32 (unwritten outputs -1).
inline std::vector<float> run_matmul(Isa isa, const WeightMatrix& w, const float* x, int64_t n_tokens,
                                     int threads) {
  ThreadPool pool(threads);
  std::vector<uint8_t> scratch(matmul_scratch_bytes(w.type, w.k, n_tokens));
  std::vector<float> y(static_cast<size_t>(n_tokens * w.n_rows), -1.0f);
  matmul(pool, isa, w, x, n_tokens, y.data(), scratch);
  return y;
}

}  // namespace kvtier::cpu::test
