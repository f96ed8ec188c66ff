// bench_gather_cuda: how fast chosen KV rows come from pinned host memory to the GPU (InfiniGen's
// selective load, docs/infinigen.md "On the GPU"). One layer of a Llama-2-7B shape (32 KV heads,
// head_dim 128, f16: 256-byte rows) with 16384 rows per plane; for a share of the rows (random, or half
// of them the most recent and the rest random), the median GiB/s over 9 runs of:
//   copy engine       cudaMemcpy2DAsync of as many rows, contiguous (what `layer` does; the bound)
//   gather <kernel>   spec_gather_rows, each kernel shape (backend/cuda/spec.h) reading the mapped host
//   planes batch rows / runs cudaMemcpyBatchAsync, one copy per chosen row / per run of consecutive rows
//                     (share 5 % only: they run at well under 1 GiB/s)
// and then, for 20 % random rows, each transfer while a compute kernel that fills every SM runs on a
// normal-priority stream (the transfer on a high- or normal-priority stream): the transfer's own time
// from its stream's events, against the compute kernel alone (does it overlap, or wait for the SMs?).
// Usage: bench_gather_cuda [rows_per_plane]   (needs a CUDA device)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/spec.h"

namespace {

using kvtier::cuda::GatherKernel;

constexpr int kReps = 9;
constexpr int64_t kHeads = 32;
constexpr size_t kRowBytes = 256;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of `reps` runs of f on stream s (CUDA events).
template <typename F>
double time_it(cudaStream_t s, F&& f) {
  cudaEvent_t a, b;
  KVTIER_CUDA_CHECK(cudaEventCreate(&a));
  KVTIER_CUDA_CHECK(cudaEventCreate(&b));
  f();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < kReps; ++r) {
    KVTIER_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    KVTIER_CUDA_CHECK(cudaEventRecord(b, s));
    KVTIER_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    KVTIER_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(t);
}

}  // namespace

// Busy work on every SM: `iters` dependent FMAs per thread (the compute a gather should overlap).
__global__ void hog_kernel(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f;
  for (int i = 0; i < iters; ++i) a = fmaf(a, b, 1e-7f);
  if (a == 12345.678f) out[0] = a;  // never true: keeps the loop
}

int main(int argc, char** argv) {
  const int64_t P = argc > 1 ? std::atoll(argv[1]) : 16384;
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "bench_gather_cuda: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  KVTIER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s; one layer: %lld KV heads x 2 planes x %lld rows of %zu bytes\n", prop.name,
              static_cast<long long>(kHeads), static_cast<long long>(P), kRowBytes);
  const size_t plane = static_cast<size_t>(P) * kRowBytes;
  const size_t total = 2 * kHeads * plane;
  uint8_t* host = nullptr;
  KVTIER_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocPortable | cudaHostAllocMapped));
  for (size_t i = 0; i < total; i += 4096) host[i] = static_cast<uint8_t>(i >> 12);
  void* host_dev = nullptr;
  KVTIER_CUDA_CHECK(cudaHostGetDevicePointer(&host_dev, host, 0));
  uint8_t* dst = nullptr;
  KVTIER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dst), total));
  int32_t* idx_dev = nullptr;
  int32_t* chosen_dev = nullptr;
  KVTIER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&idx_dev), static_cast<size_t>(kHeads * P) * 4));
  KVTIER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&chosen_dev), 4));
  cudaStream_t s;
  KVTIER_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937 rng(1);
  const std::pair<const char*, GatherKernel> kernels[] = {{"gather flat", GatherKernel::kFlat},
                                                          {"gather persistent", GatherKernel::kPersistent}};

  for (const char* pattern : {"random", "recent half"}) {
    for (double share : {0.05, 0.2, 1.0}) {
      const auto n = static_cast<int64_t>(share * static_cast<double>(P));
      // Chosen rows per head, ascending.
      std::vector<int32_t> idx(static_cast<size_t>(kHeads * P));
      for (int64_t g = 0; g < kHeads; ++g) {
        std::vector<int32_t> all(static_cast<size_t>(P));
        for (int64_t t = 0; t < P; ++t) all[t] = static_cast<int32_t>(t);
        std::vector<int32_t> pick;
        const int64_t recent = std::string(pattern) == "random" ? 0 : n / 2;
        for (int64_t t = P - recent; t < P; ++t) pick.push_back(static_cast<int32_t>(t));
        std::shuffle(all.begin(), all.begin() + (P - recent), rng);
        for (int64_t t = 0; static_cast<int64_t>(pick.size()) < n; ++t) pick.push_back(all[t]);
        std::sort(pick.begin(), pick.end());
        std::copy(pick.begin(), pick.end(), idx.begin() + g * P);
      }
      KVTIER_CUDA_CHECK(cudaMemcpy(idx_dev, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
      const auto n32 = static_cast<int32_t>(n);
      KVTIER_CUDA_CHECK(cudaMemcpy(chosen_dev, &n32, 4, cudaMemcpyHostToDevice));
      const double bytes = 2.0 * kHeads * static_cast<double>(n) * kRowBytes;
      auto line = [&](const char* what, double sec, size_t copies) {
        std::printf("%-12s %5.1f %% %-26s %8.2f GiB/s  (%.3f ms%s)\n", pattern, 100 * share, what,
                    bytes / sec / 1073741824.0, sec * 1e3,
                    copies ? (", " + std::to_string(copies) + " copies").c_str() : "");
      };
      line("copy engine (contiguous)",
           time_it(s,
                   [&] {
                     KVTIER_CUDA_CHECK(cudaMemcpy2DAsync(dst, plane, host, plane,
                                                         static_cast<size_t>(n) * kRowBytes, 2 * kHeads,
                                                         cudaMemcpyHostToDevice, s));
                   }),
           0);
      for (const auto& kernel : kernels) {
        const GatherKernel k = kernel.second;
        line(kernel.first,
             time_it(s,
                     [&] {
                       kvtier::cuda::spec_gather_rows(static_cast<const uint8_t*>(host_dev), plane, dst,
                                                      plane, kRowBytes, kHeads, idx_dev, P, chosen_dev, n, s,
                                                      k, prop.multiProcessorCount);
                     }),
             0);
      }
      if (share > 0.05) continue;
      // Copy-engine batches: one copy per row, and one per run of consecutive rows.
      for (bool runs : {false, true}) {
        std::vector<void*> dsts;
        std::vector<const void*> srcs;
        std::vector<size_t> sizes;
        for (int64_t p = 0; p < 2 * kHeads; ++p) {
          const int32_t* ix = idx.data() + (p / 2) * P;
          for (int64_t i = 0; i < n;) {
            int64_t j = i + 1;
            while (runs && j < n && ix[j] == ix[j - 1] + 1) ++j;
            dsts.push_back(dst + p * plane + i * kRowBytes);
            srcs.push_back(host + p * plane + static_cast<size_t>(ix[i]) * kRowBytes);
            sizes.push_back(static_cast<size_t>(j - i) * kRowBytes);
            i = j;
          }
        }
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        size_t attr_idx = 0;
        const cudaError_t probe =
            cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_idx, 1, s);
        if (probe != cudaSuccess) {
          cudaGetLastError();
          std::printf("%-12s %5.1f %% %-26s failed: %s\n", pattern, 100 * share,
                      runs ? "batch runs" : "batch rows", cudaGetErrorString(probe));
          continue;
        }
        KVTIER_CUDA_CHECK(cudaStreamSynchronize(s));
        line(runs ? "batch runs" : "batch rows",
             time_it(s,
                     [&] {
                       KVTIER_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                                              dsts.size(), &attr, &attr_idx, 1, s));
                     }),
             dsts.size());
      }
    }
  }
  // Under a compute load: 20 % random rows (the idx of the last "random" round is gone; make it again).
  {
    const auto n = static_cast<int64_t>(0.2 * static_cast<double>(P));
    std::vector<int32_t> idx(static_cast<size_t>(kHeads * P));
    for (int64_t g = 0; g < kHeads; ++g) {
      std::vector<int32_t> all(static_cast<size_t>(P));
      for (int64_t t = 0; t < P; ++t) all[t] = static_cast<int32_t>(t);
      std::shuffle(all.begin(), all.end(), rng);
      std::sort(all.begin(), all.begin() + n);
      std::copy(all.begin(), all.begin() + n, idx.begin() + g * P);
    }
    KVTIER_CUDA_CHECK(cudaMemcpy(idx_dev, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    const auto n32 = static_cast<int32_t>(n);
    KVTIER_CUDA_CHECK(cudaMemcpy(chosen_dev, &n32, 4, cudaMemcpyHostToDevice));
    const double bytes = 2.0 * kHeads * static_cast<double>(n) * kRowBytes;
    int least = 0, greatest = 0;
    KVTIER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t compute, hi, lo;
    KVTIER_CUDA_CHECK(cudaStreamCreateWithPriority(&compute, cudaStreamNonBlocking, least));
    KVTIER_CUDA_CHECK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
    KVTIER_CUDA_CHECK(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
    float* sink = nullptr;
    KVTIER_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&sink), 4));
    // Many short blocks (64 per SM, 8 resident at a time): compute that keeps every SM full in waves,
    // as a decode step's kernels do, so a transfer's kernel gets SM slots only as blocks retire.
    const unsigned hog_blocks = static_cast<unsigned>(prop.multiProcessorCount) * 64;
    constexpr int kHogIters = 100000;
    const double hog =
        time_it(compute, [&] { hog_kernel<<<hog_blocks, 256, 0, compute>>>(sink, kHogIters); });
    std::printf(
        "under load: a compute kernel of %u blocks x 256 threads (waves over every SM) takes %.3f ms alone\n",
        hog_blocks, hog * 1e3);
    using Transfer = std::pair<const char*, std::function<void(cudaStream_t)>>;
    const Transfer transfers[] = {
        {"copy engine (contiguous)",
         [&](cudaStream_t st) {
           KVTIER_CUDA_CHECK(cudaMemcpy2DAsync(dst, plane, host, plane, static_cast<size_t>(n) * kRowBytes,
                                               2 * kHeads, cudaMemcpyHostToDevice, st));
         }},
        {"gather flat",
         [&](cudaStream_t st) {
           kvtier::cuda::spec_gather_rows(static_cast<const uint8_t*>(host_dev), plane, dst, plane, kRowBytes,
                                          kHeads, idx_dev, P, chosen_dev, n, st, GatherKernel::kFlat,
                                          prop.multiProcessorCount);
         }},
        {"gather persistent",
         [&](cudaStream_t st) {
           kvtier::cuda::spec_gather_rows(static_cast<const uint8_t*>(host_dev), plane, dst, plane, kRowBytes,
                                          kHeads, idx_dev, P, chosen_dev, n, st, GatherKernel::kPersistent,
                                          prop.multiProcessorCount);
         }},
    };
    for (const auto& [name, fn] : transfers) {
      for (bool high : {true, false}) {
        cudaStream_t st = high ? hi : lo;
        cudaEvent_t a, b, c;
        KVTIER_CUDA_CHECK(cudaEventCreate(&a));
        KVTIER_CUDA_CHECK(cudaEventCreate(&b));
        KVTIER_CUDA_CHECK(cudaEventCreate(&c));
        std::vector<double> tt, tall;
        for (int r = 0; r <= kReps; ++r) {
          KVTIER_CUDA_CHECK(cudaDeviceSynchronize());
          KVTIER_CUDA_CHECK(cudaEventRecord(a, compute));
          hog_kernel<<<hog_blocks, 256, 0, compute>>>(sink, kHogIters);
          KVTIER_CUDA_CHECK(cudaStreamWaitEvent(st, a, 0));  // the transfer starts with the compute kernel
          fn(st);
          KVTIER_CUDA_CHECK(cudaEventRecord(b, st));
          KVTIER_CUDA_CHECK(cudaStreamWaitEvent(compute, b, 0));
          KVTIER_CUDA_CHECK(cudaEventRecord(c, compute));
          KVTIER_CUDA_CHECK(cudaEventSynchronize(c));
          float ms_t = 0, ms_all = 0;
          KVTIER_CUDA_CHECK(cudaEventElapsedTime(&ms_t, a, b));
          KVTIER_CUDA_CHECK(cudaEventElapsedTime(&ms_all, a, c));
          if (r > 0) {
            tt.push_back(ms_t / 1e3);
            tall.push_back(ms_all / 1e3);
          }
        }
        const double t = median(tt), all = median(tall);
        std::printf(
            "under load, %-6s priority: %-24s done after %.3f ms (%.2f GiB/s); both done after %.3f ms = "
            "%.2fx the compute alone\n",
            high ? "high" : "normal", name, t * 1e3, bytes / t / 1073741824.0, all * 1e3, all / hog);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
        cudaEventDestroy(c);
      }
    }
    cudaFree(sink);
    cudaStreamDestroy(compute);
    cudaStreamDestroy(hi);
    cudaStreamDestroy(lo);
  }
  cudaFree(dst);
  cudaFree(idx_dev);
  cudaFree(chosen_dev);
  cudaFreeHost(host);
  cudaStreamDestroy(s);
  return 0;
}
