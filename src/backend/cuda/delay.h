// A debug aid for race hunting: a kernel that only waits, enqueued before a copy so that the copy
// starts later than the schedule expects (the "randomly delayed copies" option of the exactness
// tests). Never used on a measured path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvtier::cuda {

// Enqueues a single-thread kernel on `stream` that spins for about `microseconds` (0: nothing).
void spin_delay(uint32_t microseconds, cudaStream_t stream);

}  // namespace kvtier::cuda
