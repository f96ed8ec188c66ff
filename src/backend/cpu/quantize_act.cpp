#include "backend/cpu/quantize_act.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/blocks.h"
#include "backend/cpu/ref_kernels.h"
#include "core/error.h"

namespace kvtier::cpu {
namespace {

// Quantises n values with one scale; returns the scale, writes q.
float quantize_group(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) {
    const float v = std::nearbyint(x[i] * id);  // default rounding mode: to nearest, ties to even
    q[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return d;
}

}  // namespace

ActFormat act_format_for(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return ActFormat::kF32;
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return ActFormat::kQ8_32;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return ActFormat::kQ8_32Min;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return ActFormat::kQ8_K;
    default:
      break;
  }
  fail(ErrorKind::kUnsupported, "CPU kernels do not support type {}", ggml_type_name(weight_type));
}

int act_block_size(ActFormat format) {
  switch (format) {
    case ActFormat::kF32:
      return 1;
    case ActFormat::kQ8_32:
    case ActFormat::kQ8_32Min:
      return kQK;
    case ActFormat::kQ8_K:
      return kQKK;
  }
  return 1;
}

size_t act_row_bytes(ActFormat format, int64_t k) {
  KVTIER_ASSERT(k % act_block_size(format) == 0, "activation row of {} elements", k);
  switch (format) {
    case ActFormat::kF32:
      return static_cast<size_t>(k) * sizeof(float);
    case ActFormat::kQ8_32:
    case ActFormat::kQ8_32Min:
      return static_cast<size_t>(k / kQK) * sizeof(ActQ8_32);
    case ActFormat::kQ8_K:
      return static_cast<size_t>(k / kQKK) * sizeof(ActQ8_K);
  }
  return 0;
}

void quantize_act_row(ActFormat format, const float* x, int64_t k, uint8_t* dst) {
  KVTIER_ASSERT(k % act_block_size(format) == 0, "activation row of {} elements", k);
  switch (format) {
    case ActFormat::kF32:
      std::memcpy(dst, x, static_cast<size_t>(k) * sizeof(float));
      return;
    case ActFormat::kQ8_32:
      ref::quantize_q8_32(x, k, dst);
      return;
    case ActFormat::kQ8_32Min:
      ref::quantize_q8_32_min(x, k, dst);
      return;
    case ActFormat::kQ8_K:
      ref::quantize_q8_k(x, k, dst);
      return;
  }
}

namespace ref {

namespace {
template <bool kMin>
void quantize_q8_32_as(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    ActQ8_32 blk;
    blk.d = quantize_group(x + b * kQK, kQK, blk.qs);
    int32_t sum = 0;
    for (int i = 0; i < kQK; ++i) sum += blk.qs[i];
    set_act_sum<kMin>(blk, sum);
    std::memcpy(dst + b * sizeof(ActQ8_32), &blk, sizeof(blk));
  }
}
}  // namespace

void quantize_q8_32(const float* x, int64_t k, uint8_t* dst) {
  quantize_q8_32_as<false>(x, k, dst);
}
void quantize_q8_32_min(const float* x, int64_t k, uint8_t* dst) {
  quantize_q8_32_as<true>(x, k, dst);
}

void quantize_q8_k(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQKK; ++b) {
    ActQ8_K blk;
    blk.d = quantize_group(x + b * kQKK, kQKK, blk.qs);
    for (int j = 0; j < kQKK / 16; ++j) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += blk.qs[16 * j + i];
      blk.bsums[j] = static_cast<int16_t>(s);
    }
    std::memcpy(dst + b * sizeof(ActQ8_K), &blk, sizeof(blk));
  }
}

}  // namespace ref
}  // namespace kvtier::cpu
