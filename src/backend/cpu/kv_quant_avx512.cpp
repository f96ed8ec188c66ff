// AVX-512 dequantiser of KIVI blocks, 16 elements at a time (head dimensions and value groups are
// multiples of 16): the same FMA per element as the scalar and AVX2 ones, hence the same bits.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/kv_quant.h"

namespace kvtier::cpu {
namespace {

// Codes of elements [i, i + 16) of a row: the low half of the lanes from the first half of the packed
// bytes, the high half from the second.
template <int BITS>
__m512i codes16(const uint8_t* row, int64_t i) {
  if constexpr (BITS == 4) {
    uint32_t w[2];
    std::memcpy(w, row + i / 2, 8);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(static_cast<int>(w[0]))),
                                         _mm256_set1_epi32(static_cast<int>(w[1])), 1);
    const __m512i sh = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    return _mm512_and_si512(_mm512_srlv_epi32(v, sh), _mm512_set1_epi32(15));
  } else {
    uint32_t w;
    std::memcpy(&w, row + i / 4, 4);
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(w)), sh),
                            _mm512_set1_epi32(3));
  }
}

__m512 half16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
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
      for (int64_t i = 0; i < d; i += 16) {
        const __m512 q = _mm512_cvtepi32_ps(codes16<BITS>(row, i));
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(q, half16(sc + i), half16(mn + i)));
      }
    } else {
      for (int64_t c = 0; c < b.param_row; ++c) {
        const __m512 s = _mm512_set1_ps(_cvtsh_ss(scale[t * b.param_row + c]));
        const __m512 m = _mm512_set1_ps(_cvtsh_ss(mins[t * b.param_row + c]));
        for (int64_t i = c * f.value_group; i < (c + 1) * f.value_group; i += 16) {
          const __m512 q = _mm512_cvtepi32_ps(codes16<BITS>(row, i));
          _mm512_storeu_ps(out + i, _mm512_fmadd_ps(q, s, m));
        }
      }
    }
  }
}

}  // namespace

void kivi_dequant_avx512(const KiviFormat& f, KiviPlane p, int64_t d, const uint8_t* block, int64_t t0,
                         int64_t n, float* dst) {
  if (f.bits == 4) {
    dequant<4>(f, p, d, block, t0, n, dst);
  } else {
    dequant<2>(f, p, d, block, t0, n, dst);
  }
}

}  // namespace kvtier::cpu
