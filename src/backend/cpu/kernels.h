// Per-ISA kernel tables. Each ISA's translation unit fills a table (starting from the scalar one,
// overriding what it implements); kernel_table(isa) hands out a table only for an ISA the running
// CPU supports, so no caller can reach an instruction the CPU lacks.
#pragma once

#include <array>
#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "core/ggml_type.h"

namespace kvtier::cpu {

// Dot product of one weight row ([k] of the weight type) with one activation row in the weight
// type's ActFormat (quantize_act.h).
using VecDotFn = float (*)(const uint8_t* w, const uint8_t* act, int64_t k);

// Float ops, all on contiguous f32 rows of n elements (see float_ops.h for the maths).
struct FloatKernels {
  void (*rms_norm)(const float* x, const float* w, float eps, int64_t n, float* y);
  void (*layer_norm)(const float* x, const float* w, const float* b, float eps, int64_t n, float* y);
  void (*silu)(const float* x, int64_t n, float* y);
  void (*gelu_tanh)(const float* x, int64_t n, float* y);
  void (*relu)(const float* x, int64_t n, float* y);
  void (*softmax)(const float* x, int64_t n, float* y);
  void (*add)(const float* a, const float* b, int64_t n, float* y);
  void (*mul)(const float* a, const float* b, int64_t n, float* y);
  // Rotates pairs (x[i0], x[i1]) by angle with the given cos/sin, for pair p: normal pairing uses
  // (2p, 2p+1), NeoX pairing (p, p + n_pairs).
  void (*rope_rotate)(float* x, const float* cos, const float* sin, int64_t n_pairs, bool neox);
};

constexpr size_t kMaxGgmlTypeId = 40;

struct KernelTable {
  Isa isa = Isa::kScalar;
  std::array<VecDotFn, kMaxGgmlTypeId> vec_dot{};  // indexed by GgmlType id; null: unsupported
  FloatKernels fops{};
};

// Throws Error(kUnsupported) when the CPU lacks `isa`.
const KernelTable& kernel_table(Isa isa);

// The fillers, one per translation unit. Only kernel_table calls them (and only for supported ISAs).
void fill_scalar_kernels(KernelTable& t);
void fill_avx2_kernels(KernelTable& t);
void fill_avx512_kernels(KernelTable& t);
void fill_avx2_float_kernels(FloatKernels& f);

}  // namespace kvtier::cpu
