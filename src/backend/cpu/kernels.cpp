#include "backend/cpu/kernels.h"

#include "core/error.h"

namespace kvtier::cpu {
namespace {

KernelTable make_table(Isa isa, bool amx) {
  KernelTable t;
  fill_scalar_kernels(t);
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    fill_avx2_kernels(t);
    fill_avx2_tiles(t);
    fill_avx2_quantize_act(t);
    fill_avx2_lanes(t);
  }
  if (isa == Isa::kAvx512) {
    fill_avx512_kernels(t);  // clears the tiles of the types it overrides
    fill_avx512_tiles(t);
    fill_avx512_quantize_act(t);
    fill_avx512_lanes(t);
    if (amx) {  // panel tiles of q4_0, q4_1, q5_0, q5_1, q4_K and q6_K (same bits)
      fill_amx_tiles(t);
      fill_amx_ktiles(t);
      // prefill of those types takes the AMX tiles rather than the vector lanes kernels
      for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                            GgmlType::kQ4_K, GgmlType::kQ6_K})
        t.lanes_any_tokens[static_cast<size_t>(type)] = false;
    }
  }
  t.isa = isa;
  return t;
}

}  // namespace

const KernelTable& kernel_table(Isa isa, MatrixUnits units) {
  require_isa(isa);
  static const KernelTable scalar = make_table(Isa::kScalar, false);
  switch (isa) {
    case Isa::kScalar:
      return scalar;
    case Isa::kAvx2: {
      static const KernelTable avx2 = make_table(Isa::kAvx2, false);
      return avx2;
    }
    case Isa::kAvx512: {
      static const KernelTable avx512 = make_table(Isa::kAvx512, cpu_features().amx_int8);
      static const KernelTable avx512_vector = make_table(Isa::kAvx512, false);
      return units == MatrixUnits::kBest ? avx512 : avx512_vector;
    }
  }
  return scalar;
}

}  // namespace kvtier::cpu
