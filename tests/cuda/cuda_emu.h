// A small host emulation of the CUDA built-ins that the attention kernels use, so that their device
// code (backend/cuda/attention_kernels.cuh) runs on the CPU in tests where no GPU is present.
// Every CUDA thread of a block is a user-level context (ucontext) scheduled cooperatively on the
// calling thread: __syncthreads and the warp shuffles are barriers that yield until all
// participants arrive. Shared memory is poisoned with NaN, so a read of an element the block never
// wrote shows up in the results. Not a model of timing, memory ordering or races: it checks the
// kernels' arithmetic and indexing only.
//
// Include after backend/cuda/attention.h (which pulls in the CUDA runtime header) and before
// backend/cuda/attention_kernels.cuh; define KVTIER_CUDA_EMULATION first.
#pragma once

#ifndef KVTIER_CUDA_EMULATION
#error "define KVTIER_CUDA_EMULATION before including cuda_emu.h"
#endif

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/half.h"

// CUDA's function-space qualifiers mean nothing here.
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define CUDART_INF_F (std::numeric_limits<float>::infinity())

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// One emulated thread: its indices and context (its stack belongs to launch()).
struct Thread {
  Dim3 tid;
  ucontext_t ctx{};
  bool done = false;
};

// The block being run: the CUDA built-ins reach it through `current()` (the emulation is
// single-threaded; a test harness, not library code).
struct Block {
  Dim3 bid, block_dim, grid_dim;
  std::vector<Thread> threads;
  size_t running = 0;  // index of the thread now executing
  ucontext_t scheduler{};
  std::vector<float> smem;
  // Barriers: one for the block, one per warp, each a count and a generation.
  int block_count = 0;
  uint64_t block_gen = 0;
  std::vector<int> warp_count;
  std::vector<uint64_t> warp_gen;
  std::vector<float> exchange;  // [threads] shuffle slots
};

inline Block*& current() {
  static Block* b = nullptr;
  return b;
}

inline void yield() {
  Block& b = *current();
  swapcontext(&b.threads[b.running].ctx, &b.scheduler);
}

inline void barrier(int& count, uint64_t& gen, int n) {
  const uint64_t my = gen;
  if (++count == n) {
    count = 0;
    ++gen;
    return;
  }
  while (gen == my) yield();
}

inline void sync_block() {
  Block& b = *current();
  barrier(b.block_count, b.block_gen, static_cast<int>(b.threads.size()));
}

inline void sync_warp() {
  Block& b = *current();
  const size_t w = b.running / 32;
  barrier(b.warp_count[w], b.warp_gen[w], 32);
}

inline float shuffle(float v, int src_lane) {
  Block& b = *current();
  const size_t w = b.running / 32;
  const size_t lane = b.running % 32;
  b.exchange[w * 32 + lane] = v;
  sync_warp();
  const float r = b.exchange[w * 32 + static_cast<size_t>(src_lane & 31)];
  sync_warp();
  return r;
}

template <typename F>
void thread_entry(F* f) {
  (*f)();
  Block& b = *current();
  b.threads[b.running].done = true;
}

template <typename F>
void trampoline(unsigned lo, unsigned hi) {
  const uintptr_t p = (static_cast<uintptr_t>(hi) << 32) | lo;
  thread_entry(reinterpret_cast<F*>(p));
}

// Runs f() as every thread of every block of the grid; `smem_bytes` of dynamic shared memory.
template <typename F>
void launch(Dim3 grid, Dim3 block, size_t smem_bytes, F f) {
  KVTIER_ASSERT(block.x % 32 == 0 && block.y == 1 && block.z == 1, "emulated blocks are 1-D, whole warps");
  constexpr size_t kStack = 64 * 1024;
  std::vector<std::unique_ptr<char[]>> stacks(block.x);
  for (auto& s : stacks) s.reset(new char[kStack]);
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.bid = {x, y, z};
        b.block_dim = block;
        b.grid_dim = grid;
        b.smem.assign(smem_bytes / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
        b.threads.resize(block.x);
        b.warp_count.assign(block.x / 32, 0);
        b.warp_gen.assign(block.x / 32, 0);
        b.exchange.assign(block.x, 0.0f);
        current() = &b;
        const auto p = reinterpret_cast<uintptr_t>(&f);
        for (unsigned t = 0; t < block.x; ++t) {
          Thread& th = b.threads[t];
          th.tid = {t, 0, 0};
          getcontext(&th.ctx);
          th.ctx.uc_stack.ss_sp = stacks[t].get();
          th.ctx.uc_stack.ss_size = kStack;
          th.ctx.uc_link = &b.scheduler;
          makecontext(&th.ctx, reinterpret_cast<void (*)()>(&trampoline<F>), 2, static_cast<unsigned>(p),
                      static_cast<unsigned>(p >> 32));
        }
        for (bool left = true; left;) {
          left = false;
          for (size_t t = 0; t < b.threads.size(); ++t) {
            if (b.threads[t].done) continue;
            b.running = t;
            swapcontext(&b.scheduler, &b.threads[t].ctx);
            left = left || !b.threads[t].done;
          }
        }
        current() = nullptr;
      }
    }
  }
}

// The element types of a KV cache as the kernels see them.
struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};

}  // namespace emu

// The CUDA built-ins, as the kernels spell them.
#define threadIdx (::emu::current()->threads[::emu::current()->running].tid)
#define blockIdx (::emu::current()->bid)
#define blockDim (::emu::current()->block_dim)
#define gridDim (::emu::current()->grid_dim)
#define KVTIER_ATTN_DYNAMIC_SMEM(name) float* name = ::emu::current()->smem.data()

inline void __syncthreads() {
  emu::sync_block();
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu::sync_warp();
}
inline float __shfl_sync(unsigned, float v, int src) {
  return emu::shuffle(v, src);
}
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  const int lane = static_cast<int>(emu::current()->running % 32);
  return emu::shuffle(v, lane ^ mask);
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline int64_t min(int64_t a, int64_t b) {
  return a < b ? a : b;
}
inline int64_t max(int64_t a, int64_t b) {
  return a > b ? a : b;
}

namespace kvtier::cuda {
inline float to_f32(float x) {
  return x;
}
inline float to_f32(emu::Half x) {
  return f16_to_f32(x.bits);
}
inline float to_f32(emu::Bf16 x) {
  return bf16_to_f32(x.bits);
}
}  // namespace kvtier::cuda
