// KIVI quantisers (scalar: they run once per token group, off the attention path), the scalar
// dequantiser, and the per-ISA choice.
#include "backend/cpu/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

// The f16 nearest to x on the side of -inf (down) or +inf (up); x must be finite and within f16 range.
uint16_t f16_toward(float x, bool up) {
  uint16_t h = f32_to_f16(x);
  const float y = f16_to_f32(h);
  if (up ? y >= x : y <= x) return h;
  const bool neg = (h & 0x8000) != 0;
  if ((h & 0x7fff) == 0) return up ? 0x0001 : 0x8001;  // +-0: the smallest subnormal of the wanted sign
  // Toward +inf: a positive value grows (h + 1), a negative one shrinks in magnitude (h - 1).
  return static_cast<uint16_t>(up != neg ? h + 1 : h - 1);
}

struct Params {
  uint16_t scale;
  uint16_t min;
};

// min rounded down and scale rounded up in f16, so that [min, min + levels * scale] covers [lo, hi]
// and no element is clamped by more than rounding.
Params params_for(float lo, float hi, int bits) {
  const auto levels = static_cast<float>((1 << bits) - 1);
  const uint16_t mn = f16_toward(lo, false);
  const float range = hi - f16_to_f32(mn);
  return {range > 0.0f ? f16_toward(range / levels, true) : uint16_t{0}, mn};
}

uint32_t quantise(float x, Params p, int bits) {
  const float s = f16_to_f32(p.scale);
  if (s == 0.0f) return 0;
  const float q = std::nearbyint((x - f16_to_f32(p.min)) / s);
  return static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>((1 << bits) - 1)));
}

void put(uint8_t* row, int64_t i, int bits, uint32_t q) {
  const int64_t bit = i * bits;
  row[bit / 8] = static_cast<uint8_t>(row[bit / 8] | (q << (bit % 8)));
}

uint32_t get(const uint8_t* row, int64_t i, int bits) {
  const int64_t bit = i * bits;
  return (row[bit / 8] >> (bit % 8)) & ((1u << bits) - 1);
}

}  // namespace

KiviBlockParts kivi_block_parts(const KiviFormat& f, KiviPlane p, int64_t d) {
  KiviBlockParts b{};
  b.row_bytes = static_cast<uint64_t>(d * f.bits / 8);
  b.data_bytes = b.row_bytes * static_cast<uint64_t>(f.block_tokens);
  if (p == KiviPlane::kKey) {
    b.param_row = d;
    b.param_count = static_cast<uint64_t>(f.block_tokens / f.key_group * d);
  } else {
    b.param_row = d / f.value_group;
    b.param_count = static_cast<uint64_t>(f.block_tokens * b.param_row);
  }
  return b;
}

KiviFormat kivi_format(int bits, int64_t block_tokens, int64_t key_group, int64_t head_dim_k,
                       int64_t head_dim_v) {
  if (bits != 4 && bits != 2) fail(ErrorKind::kInvalidArgument, "KIVI quantisation to {} bits: 4 or 2", bits);
  if (key_group < 1 || block_tokens % key_group != 0) {
    fail(ErrorKind::kInvalidArgument,
         "--kivi-group {}: a key group must divide the KV block of {} tokens (a group never straddles "
         "two blocks); use a divisor of {}, e.g. 32",
         key_group, block_tokens, block_tokens);
  }
  for (int64_t d : {head_dim_k, head_dim_v}) {
    if (d % 16 != 0) {
      fail(ErrorKind::kUnsupported,
           "KIVI quantisation needs a head dimension that is a multiple of 16 (packed rows of whole "
           "words), this model's is {}",
           d);
    }
  }
  KiviFormat f;
  f.bits = bits;
  f.block_tokens = block_tokens;
  f.key_group = key_group;
  f.value_group = head_dim_v % 32 == 0 ? 32 : head_dim_v;
  return f;
}

uint64_t kivi_block_bytes(const KiviFormat& f, KiviPlane p, int64_t d) {
  const KiviBlockParts b = kivi_block_parts(f, p, d);
  return b.data_bytes + 2 * b.param_count * sizeof(uint16_t);
}

void kivi_quantize_keys(const KiviFormat& f, int64_t d, const uint16_t* src, int64_t src_stride,
                        int64_t group, uint8_t* block) {
  KVTIER_ASSERT(group >= 0 && (group + 1) * f.key_group <= f.block_tokens, "key group {}", group);
  const KiviBlockParts b = kivi_block_parts(f, KiviPlane::kKey, d);
  auto* scale = reinterpret_cast<uint16_t*>(block + b.data_bytes) + group * d;
  auto* mins = reinterpret_cast<uint16_t*>(block + b.data_bytes) + b.param_count + group * d;
  uint8_t* data = block + static_cast<uint64_t>(group * f.key_group) * b.row_bytes;
  std::memset(data, 0, b.row_bytes * static_cast<uint64_t>(f.key_group));
  for (int64_t i = 0; i < d; ++i) {
    float lo = f16_to_f32(src[i]);
    float hi = lo;
    for (int64_t j = 1; j < f.key_group; ++j) {
      const float x = f16_to_f32(src[j * src_stride + i]);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const Params p = params_for(lo, hi, f.bits);
    scale[i] = p.scale;
    mins[i] = p.min;
    for (int64_t j = 0; j < f.key_group; ++j)
      put(data + j * b.row_bytes, i, f.bits, quantise(f16_to_f32(src[j * src_stride + i]), p, f.bits));
  }
}

void kivi_quantize_values(const KiviFormat& f, int64_t d, const uint16_t* src, int64_t src_stride, int64_t t0,
                          int64_t n, uint8_t* block) {
  KVTIER_ASSERT(t0 >= 0 && t0 + n <= f.block_tokens, "value rows [{}, +{})", t0, n);
  const KiviBlockParts b = kivi_block_parts(f, KiviPlane::kValue, d);
  auto* scale = reinterpret_cast<uint16_t*>(block + b.data_bytes);
  auto* mins = scale + b.param_count;
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* x = src + j * src_stride;
    const int64_t t = t0 + j;
    uint8_t* row = block + static_cast<uint64_t>(t) * b.row_bytes;
    std::memset(row, 0, b.row_bytes);
    for (int64_t c = 0; c < b.param_row; ++c) {
      const uint16_t* xc = x + c * f.value_group;
      float lo = f16_to_f32(xc[0]);
      float hi = lo;
      for (int64_t i = 1; i < f.value_group; ++i) {
        lo = std::min(lo, f16_to_f32(xc[i]));
        hi = std::max(hi, f16_to_f32(xc[i]));
      }
      const Params p = params_for(lo, hi, f.bits);
      scale[t * b.param_row + c] = p.scale;
      mins[t * b.param_row + c] = p.min;
      for (int64_t i = 0; i < f.value_group; ++i)
        put(row, c * f.value_group + i, f.bits, quantise(f16_to_f32(xc[i]), p, f.bits));
    }
  }
}

void kivi_dequant_ref(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                      int64_t n, float* dst) {
  const KiviBlockParts b = kivi_block_parts(f, p, d);
  const auto* scale = reinterpret_cast<const uint16_t*>(block + b.data_bytes);
  const uint16_t* mins = scale + b.param_count;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = t0 + j;
    const uint8_t* row = block + static_cast<uint64_t>(t) * b.row_bytes;
    for (int64_t i = 0; i < d; ++i) {
      const int64_t pi =
          p == KiviPlane::kKey ? (t / f.key_group) * d + i : t * b.param_row + i / f.value_group;
      dst[j * d + i] =
          std::fma(static_cast<float>(get(row, i, f.bits)), f16_to_f32(scale[pi]), f16_to_f32(mins[pi]));
    }
  }
}

KiviDequantFn kivi_dequant_fn(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return kivi_dequant_ref;
    case Isa::kAvx2:
      return kivi_dequant_avx2;
    default:
      return kivi_dequant_avx512;
  }
}

}  // namespace kvtier::cpu
