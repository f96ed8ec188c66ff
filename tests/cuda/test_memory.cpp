// Memory, streams and error checks of the CUDA backend. The bookkeeping and error-message tests run
// everywhere (no device needed); the arena, pinned pool and stream tests need a GPU and skip loudly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/bump_allocator.h"
#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/pinned_pool.h"
#include "backend/cuda/probe.h"
#include "backend/cuda/stream.h"
#include "gpu_test_util.h"

namespace kvtier::cuda {
namespace {

TEST(CudaBumpAllocator, AlignsTracksPeakAndRewinds) {
  BumpAllocator a("test region", 4096, 256);
  EXPECT_EQ(a.allocate(1, "x"), 0u);
  EXPECT_EQ(a.allocate(300, "y"), 256u);
  EXPECT_EQ(a.used(), 256u + 512u);
  const size_t m = a.mark();
  a.allocate(1024, "z");
  EXPECT_EQ(a.peak(), 256u + 512u + 1024u);
  a.rewind(m);
  EXPECT_EQ(a.used(), m);
  EXPECT_EQ(a.peak(), 256u + 512u + 1024u);
  a.reset();
  EXPECT_EQ(a.available(), 4096u);
}

TEST(CudaBumpAllocator, OverBudgetNamesNeededAndAvailableBytes) {
  BumpAllocator a("device arena", 1000, 8);
  a.allocate(600, "weights");
  try {
    a.allocate(500, "kv cache");
    FAIL() << "expected a budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("device arena"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kv cache"), std::string::npos) << msg;
    EXPECT_NE(msg.find("504 bytes needed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("400 bytes available"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.used(), 600u);  // a failed allocation changes nothing
}

TEST(CudaCheck, ErrorNamesCallAndLocation) {
  try {
    check(cudaErrorInvalidValue, "cudaMemcpyAsync(dst, src, n, kind, stream)", "kernels.cu", 42);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaMemcpyAsync(dst, src, n, kind, stream)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("kernels.cu:42"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
  }
  try {
    check(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "arena.cpp", 7);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
  }
  EXPECT_NO_THROW(check(cudaSuccess, "fine", "x.cu", 1));
}

TEST(CudaDeviceArena, BudgetEnforcedAndMemInfoReported) {
  KVTIER_REQUIRE_GPU();
  DeviceArena arena(size_t{64} << 20);
  auto* a = arena.allocate<float>(1 << 20, "a");  // 4 MiB
  auto* b = arena.allocate<float>(1 << 20, "b");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a), size_t{4} << 20);
  EXPECT_THROW(arena.allocate<float>(size_t{16} << 20, "too much"), Error);
  EXPECT_EQ(arena.used(), size_t{8} << 20);
  // The memory is usable.
  KVTIER_CUDA_CHECK(cudaMemset(a, 0, size_t{8} << 20));
  KVTIER_CUDA_CHECK(cudaDeviceSynchronize());
  const DeviceMemInfo info = device_mem_info();
  EXPECT_GT(info.total_bytes, arena.budget());
  EXPECT_LE(info.free_bytes, info.total_bytes);
}

TEST(CudaDeviceArena, ImpossibleBudgetIsABudgetError) {
  KVTIER_REQUIRE_GPU();
  try {
    DeviceArena arena(size_t{1} << 50);  // 1 PiB
    FAIL() << "expected a budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    EXPECT_NE(std::string(e.what()).find("--device-mem"), std::string::npos) << e.what();
  }
}

TEST(CudaPinnedPool, AllocatesPinnedMemoryAndCopiesAsync) {
  KVTIER_REQUIRE_GPU();
  PinnedHostPool pool(size_t{8} << 20);
  auto* h = pool.allocate<float>(1024, "staging");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % 4096, 0u);
  cudaPointerAttributes attr{};
  KVTIER_CUDA_CHECK(cudaPointerGetAttributes(&attr, h));
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  for (int i = 0; i < 1024; ++i) h[i] = static_cast<float>(i);
  Streams s;
  test::DeviceBuffer<float> d(1024);
  Event up, down;
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(d.get(), h, 4096, cudaMemcpyHostToDevice, s.h2d.get()));
  up.record(s.h2d.get());
  up.wait_on(s.d2h.get());  // the write-back waits for the upload through an event
  auto* back = pool.allocate<float>(1024, "readback");
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(back, d.get(), 4096, cudaMemcpyDeviceToHost, s.d2h.get()));
  down.record(s.d2h.get());
  down.synchronize();
  EXPECT_TRUE(down.done());
  for (int i = 0; i < 1024; ++i) ASSERT_EQ(back[i], static_cast<float>(i));
  EXPECT_THROW(pool.allocate<uint8_t>(size_t{16} << 20, "too much"), Error);
}

TEST(CudaPinnedPool, ImpossiblePinningIsABudgetError) {
  KVTIER_REQUIRE_GPU();
  try {
    PinnedHostPool pool(size_t{1} << 50);
    FAIL() << "expected a budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    EXPECT_NE(std::string(e.what()).find("cudaHostAlloc"), std::string::npos) << e.what();
  }
}

TEST(CudaStream, TimingEventsMeasureElapsedTime) {
  KVTIER_REQUIRE_GPU();
  Stream s;
  Event a(EventTiming::kOn), b(EventTiming::kOn);
  test::DeviceBuffer<uint8_t> buf(size_t{64} << 20);
  a.record(s.get());
  KVTIER_CUDA_CHECK(cudaMemsetAsync(buf.get(), 1, buf.size(), s.get()));
  b.record(s.get());
  s.synchronize();
  EXPECT_GE(Event::elapsed_ms(a, b), 0.0f);
}

}  // namespace
}  // namespace kvtier::cuda

namespace kvtier::cuda {
namespace {

TEST(CudaContext, ReservesResourcesAndReportsMemory) {
  KVTIER_REQUIRE_GPU();
  Context ctx(ContextOptions{0, size_t{256} << 20, size_t{16} << 20});
  const MemoryReport r = ctx.memory_report();
  EXPECT_EQ(r.arena_budget, size_t{256} << 20);
  EXPECT_EQ(r.arena_used, Blas::kWorkspaceBytes);  // the cuBLAS workspace
  EXPECT_EQ(r.pinned_capacity, size_t{16} << 20);
  EXPECT_GT(r.device_total, r.arena_budget);
  EXPECT_THROW(Context(ContextOptions{1 << 20, 1 << 20, 0}), Error);
}

}  // namespace
}  // namespace kvtier::cuda

namespace kvtier::cuda {
namespace {

TEST(CudaProbe, MeasuresPinnedCopyBandwidth) {
  KVTIER_REQUIRE_GPU();
  Context ctx(ContextOptions{0, size_t{512} << 20, size_t{256} << 20});
  const CopyBandwidth bw = measure_copy_bandwidth(ctx, size_t{256} << 20, 5);
  std::fprintf(stderr, "pinned cudaMemcpyAsync, 256 MiB: H2D %.1f GiB/s, D2H %.1f GiB/s (median of %d)\n",
               bw.h2d_gib_s, bw.d2h_gib_s, bw.reps);
  EXPECT_GT(bw.h2d_gib_s, 1.0);
  EXPECT_GT(bw.d2h_gib_s, 1.0);
  EXPECT_EQ(ctx.pinned().used(), 0u);
}

}  // namespace
}  // namespace kvtier::cuda
