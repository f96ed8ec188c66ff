// spin_delay (delay.h): one thread polls the SM clock until the requested time has passed.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delay.h"

namespace kvtier::cuda {
namespace {

__global__ void spin_kernel(uint64_t nanoseconds) {
  uint64_t t0 = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  uint64_t t = t0;
  while (t - t0 < nanoseconds) {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  }
}

}  // namespace

void spin_delay(uint32_t microseconds, cudaStream_t stream) {
  if (microseconds == 0) return;
  spin_kernel<<<1, 1, 0, stream>>>(uint64_t{microseconds} * 1000);
  KVTIER_CUDA_CHECK_LAUNCH("spin_kernel");
}

}  // namespace kvtier::cuda
