// AVX2 + FMA + F16C dequantiser of KIVI blocks, 8 elements at a time: the packed codes of one row are
// broadcast and shifted per lane, then q * scale + min in one FMA (the scalar reference's std::fma).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kv_quant.h"

namespace kvtier::cpu {
namespace {

// Codes of elements [i, i + 8) of a row.
template <int BITS>
__m256i codes8(const uint8_t* row, int64_t i) {
  if constexpr (BITS == 4) {
    uint32_t w;
    std::memcpy(&w, row + i / 2, 4);
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                            _mm256_set1_epi32(15));
  } else {
    uint16_t w;
    std::memcpy(&w, row + i / 4, 2);
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w), sh), _mm256_set1_epi32(3));
  }
}

__m256 half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int BITS>
void dequant(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0, int64_t n,
             float* dst) {
  const KiviBlockParts b = kivi_block_parts(f, p, d);
  const auto* scale = reinterpret_cast<const uint16_t*>(block + b.data_bytes);
  const uint16_t* mins = scale + b.param_count;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = t0 + j;
    const uint8_t* row = block + static_cast<uint64_t>(t) * b.row_bytes;
    float* out = dst + j * d;
    if (p == KiviPlane::kKey) {
      const uint16_t* sc = scale + (t / f.key_group) * d;
      const uint16_t* mn = mins + (t / f.key_group) * d;
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 q = _mm256_cvtepi32_ps(codes8<BITS>(row, i));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(q, half8(sc + i), half8(mn + i)));
      }
    } else {
      for (int64_t c = 0; c < b.param_row; ++c) {
        const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[t * b.param_row + c]));
        const __m256 m = _mm256_set1_ps(_cvtsh_ss(mins[t * b.param_row + c]));
        for (int64_t i = c * f.value_group; i < (c + 1) * f.value_group; i += 8) {
          const __m256 q = _mm256_cvtepi32_ps(codes8<BITS>(row, i));
          _mm256_storeu_ps(out + i, _mm256_fmadd_ps(q, s, m));
        }
      }
    }
  }
}

}  // namespace

void kivi_dequant_avx2(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                       int64_t n, float* dst) {
  if (f.bits == 4) {
    dequant<4>(f, p, d, block, t0, n, dst);
  } else {
    dequant<2>(f, p, d, block, t0, n, dst);
  }
}

}  // namespace kvtier::cpu
