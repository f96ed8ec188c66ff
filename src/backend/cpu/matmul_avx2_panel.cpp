// The AVX2 instance of legacy_chain.h: q4_0, q4_1, q5_0 and q5_1 with VPMADDUBSW integer dots.
#include "backend/cpu/legacy_chain.h"

namespace kvtier::cpu {

void fill_avx2_panel_kernels(KernelTable& t) {
  fill_legacy_chain<false>(t);
}

}  // namespace kvtier::cpu
