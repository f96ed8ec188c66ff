// Element types of device buffers that the CUDA kernels read and write besides f32 activations.
#pragma once

#include <cstddef>

namespace kvtier::cuda {

// Storage type of K/V rows in a device cache or span.
enum class KvDtype {
  kF32,
  kF16,   // IEEE half, as the CPU backend's KvDtype::kF16 (rounded to nearest even)
  kBF16,  // bfloat16 (rounded to nearest even)
};

inline size_t kv_dtype_bytes(KvDtype t) {
  return t == KvDtype::kF32 ? 4 : 2;
}

}  // namespace kvtier::cuda
