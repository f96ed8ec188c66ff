// AVX-512 (+VNNI) dot products; types without a 512-bit kernel keep the AVX2 one.
#include "backend/cpu/kernels.h"

namespace kvtier::cpu {

void fill_avx512_kernels(KernelTable& t) {
  (void)t;
}

}  // namespace kvtier::cpu
