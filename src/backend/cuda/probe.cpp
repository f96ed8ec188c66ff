#include "backend/cuda/probe.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/stream.h"

namespace kvtier::cuda {
namespace {

double median_gib_s(std::vector<float> ms, size_t bytes) {
  std::sort(ms.begin(), ms.end());
  const double m = ms[ms.size() / 2];
  return m > 0.0 ? static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) / (m / 1000.0) : 0.0;
}

std::vector<float> time_copies(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                               int reps) {
  std::vector<float> ms;
  Event a(EventTiming::kOn), b(EventTiming::kOn);
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));  // warm-up
  for (int i = 0; i < reps; ++i) {
    a.record(s);
    KVTIER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    b.record(s);
    b.synchronize();
    ms.push_back(Event::elapsed_ms(a, b));
  }
  return ms;
}

}  // namespace

CopyBandwidth measure_copy_bandwidth(Context& ctx, size_t bytes, int reps) {
  KVTIER_ASSERT(bytes > 0 && reps > 0, "{} bytes x {}", bytes, reps);
  const size_t dmark = ctx.arena().mark(), hmark = ctx.pinned().mark();
  CopyBandwidth r;
  r.bytes = bytes;
  r.reps = reps;
  try {
    void* d = ctx.arena().allocate_bytes(bytes, "bandwidth probe");
    void* h = ctx.pinned().allocate_bytes(bytes, "bandwidth probe");
    r.h2d_gib_s =
        median_gib_s(time_copies(d, h, bytes, cudaMemcpyHostToDevice, ctx.streams().h2d.get(), reps), bytes);
    r.d2h_gib_s =
        median_gib_s(time_copies(h, d, bytes, cudaMemcpyDeviceToHost, ctx.streams().d2h.get(), reps), bytes);
  } catch (...) {
    ctx.arena().rewind(dmark);
    ctx.pinned().rewind(hmark);
    throw;
  }
  ctx.arena().rewind(dmark);
  ctx.pinned().rewind(hmark);
  return r;
}

CopyBandwidth measure_copy_bandwidth(int device, size_t bytes, int reps) {
  KVTIER_ASSERT(bytes > 0 && reps > 0, "{} bytes x {}", bytes, reps);
  KVTIER_CUDA_CHECK(cudaSetDevice(device));
  // Owned buffers: freed on every path out.
  struct Buffers {
    void* d = nullptr;
    void* h = nullptr;
    ~Buffers() {
      if (d) cudaFree(d);
      if (h) cudaFreeHost(h);
    }
  } buf;
  KVTIER_CUDA_CHECK(cudaMalloc(&buf.d, bytes));
  KVTIER_CUDA_CHECK(cudaHostAlloc(&buf.h, bytes, cudaHostAllocDefault));
  const Stream stream;
  CopyBandwidth r;
  r.bytes = bytes;
  r.reps = reps;
  r.h2d_gib_s =
      median_gib_s(time_copies(buf.d, buf.h, bytes, cudaMemcpyHostToDevice, stream.get(), reps), bytes);
  r.d2h_gib_s =
      median_gib_s(time_copies(buf.h, buf.d, bytes, cudaMemcpyDeviceToHost, stream.get(), reps), bytes);
  return r;
}

}  // namespace kvtier::cuda
