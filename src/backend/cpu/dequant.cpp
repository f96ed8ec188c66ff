#include "backend/cpu/dequant.h"

#include <cstring>

#include "backend/cpu/block_unpack.h"
#include "core/error.h"

namespace kvtier::cpu {
namespace {

void dequant_q4_0(const BlockQ4_0& b, float* y) {
  const float d = unpack_f16(b.d);
  for (int i = 0; i < kQK / 2; ++i) {
    y[i] = d * static_cast<float>((b.qs[i] & 0xF) - 8);
    y[i + kQK / 2] = d * static_cast<float>((b.qs[i] >> 4) - 8);
  }
}

void dequant_q4_1(const BlockQ4_1& b, float* y) {
  const float d = unpack_f16(b.d), m = unpack_f16(b.m);
  for (int i = 0; i < kQK / 2; ++i) {
    y[i] = d * static_cast<float>(b.qs[i] & 0xF) + m;
    y[i + kQK / 2] = d * static_cast<float>(b.qs[i] >> 4) + m;
  }
}

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dequant_q5_0(const BlockQ5_0& b, float* y) {
  const float d = unpack_f16(b.d);
  const uint32_t qh = load_qh(b.qh);
  for (int i = 0; i < kQK / 2; ++i) {
    const int q0 = (b.qs[i] & 0xF) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int q1 = (b.qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = d * static_cast<float>(q0 - 16);
    y[i + kQK / 2] = d * static_cast<float>(q1 - 16);
  }
}

void dequant_q5_1(const BlockQ5_1& b, float* y) {
  const float d = unpack_f16(b.d), m = unpack_f16(b.m);
  const uint32_t qh = load_qh(b.qh);
  for (int i = 0; i < kQK / 2; ++i) {
    const int q0 = (b.qs[i] & 0xF) | static_cast<int>(((qh >> i) & 1u) << 4);
    const int q1 = (b.qs[i] >> 4) | static_cast<int>(((qh >> (i + 16)) & 1u) << 4);
    y[i] = d * static_cast<float>(q0) + m;
    y[i + kQK / 2] = d * static_cast<float>(q1) + m;
  }
}

void dequant_q8_0(const BlockQ8_0& b, float* y) {
  const float d = unpack_f16(b.d);
  for (int i = 0; i < kQK; ++i) y[i] = static_cast<float>(b.qs[i]) * d;
}

// Element e of a Q2_K block: half h = e / 128, 2-bit field s = (e % 128) / 32, l = e % 32;
// q = (qs[32 h + l] >> 2 s) & 3, scale/min byte e / 16.
void dequant_q2_k(const BlockQ2_K& b, float* y) {
  const float d = unpack_f16(b.d), dmin = unpack_f16(b.dmin);
  for (int e = 0; e < kQKK; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int q = (b.qs[32 * h + l] >> (2 * s)) & 3;
    const uint8_t sc = b.scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0xF);
    const float ml = dmin * static_cast<float>(sc >> 4);
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: low 2 bits as Q2_K; high bit (e / 32) of hmask[e % 32]; q = low - (high ? 0 : 4).
void dequant_q3_k(const BlockQ3_K& b, float* y) {
  const float d = unpack_f16(b.d);
  int8_t scales[16];
  unpack_scales_q3_k(b.scales, scales);
  for (int e = 0; e < kQKK; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int lo = (b.qs[32 * h + l] >> (2 * s)) & 3;
    const int hi = (b.hmask[l] >> (e / 32)) & 1;
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>(lo - (hi ? 0 : 4));
  }
}

// Q4_K: chunk c = e / 64 of 32 bytes; nibble (e % 64) / 32 of qs[32 c + e % 32]; sub-block e / 32.
void dequant_q4_k(const BlockQ4_K& b, float* y) {
  const float d = unpack_f16(b.d), dmin = unpack_f16(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    unpack_scale_min_k4(b.scales, j, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    const uint8_t* q = b.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = d1 * static_cast<float>((q[l] >> shift) & 0xF) - m1;
  }
}

// Q5_K: as Q4_K, fifth bit j of qh[l] for sub-block j.
void dequant_q5_k(const BlockQ5_K& b, float* y) {
  const float d = unpack_f16(b.d), dmin = unpack_f16(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, mn;
    unpack_scale_min_k4(b.scales, j, &sc, &mn);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(mn);
    const uint8_t* q = b.qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0xF) | (((b.qh[l] >> j) & 1) << 4);
      y[32 * j + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

// Q6_K: half h = e / 128, r = e % 128: low nibble (r / 64) of ql[64 h + r % 64], high bits
// field (r / 32) of qh[32 h + r % 32]; scale e / 16.
void dequant_q6_k(const BlockQ6_K& b, float* y) {
  const float d = unpack_f16(b.d);
  for (int e = 0; e < kQKK; ++e) {
    const int h = e / 128, r = e % 128;
    const int lo = (b.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
    const int hi = (b.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    const float ds = d * static_cast<float>(b.scales[e / 16]);
    y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
  }
}

template <typename Block>
void dequant_blocks(const uint8_t* src, float* dst, int64_t n, int block_size,
                    void (*fn)(const Block&, float*)) {
  const int64_t n_blocks = n / block_size;
  for (int64_t i = 0; i < n_blocks; ++i) {
    Block b;
    std::memcpy(&b, src + i * sizeof(Block), sizeof(Block));
    fn(b, dst + i * block_size);
  }
}

}  // namespace

bool is_supported_weight_type(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void dequantize_row(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const auto& t = ggml_traits(type);
  if (!is_supported_weight_type(type))
    fail(ErrorKind::kUnsupported, "CPU kernels do not support type {}", t.name);
  KVTIER_ASSERT(n % t.block_size == 0, "{} row of {} elements", t.name, n);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = unpack_f16(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = unpack_bf16(h);
      }
      return;
    case GgmlType::kQ4_0:
      return dequant_blocks<BlockQ4_0>(src, dst, n, kQK, dequant_q4_0);
    case GgmlType::kQ4_1:
      return dequant_blocks<BlockQ4_1>(src, dst, n, kQK, dequant_q4_1);
    case GgmlType::kQ5_0:
      return dequant_blocks<BlockQ5_0>(src, dst, n, kQK, dequant_q5_0);
    case GgmlType::kQ5_1:
      return dequant_blocks<BlockQ5_1>(src, dst, n, kQK, dequant_q5_1);
    case GgmlType::kQ8_0:
      return dequant_blocks<BlockQ8_0>(src, dst, n, kQK, dequant_q8_0);
    case GgmlType::kQ2_K:
      return dequant_blocks<BlockQ2_K>(src, dst, n, kQKK, dequant_q2_k);
    case GgmlType::kQ3_K:
      return dequant_blocks<BlockQ3_K>(src, dst, n, kQKK, dequant_q3_k);
    case GgmlType::kQ4_K:
      return dequant_blocks<BlockQ4_K>(src, dst, n, kQKK, dequant_q4_k);
    case GgmlType::kQ5_K:
      return dequant_blocks<BlockQ5_K>(src, dst, n, kQKK, dequant_q5_k);
    case GgmlType::kQ6_K:
      return dequant_blocks<BlockQ6_K>(src, dst, n, kQKK, dequant_q6_k);
    default:
      break;
  }
  fail(ErrorKind::kUnsupported, "CPU kernels do not support type {}", t.name);
}

}  // namespace kvtier::cpu
