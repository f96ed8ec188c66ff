// `--backend cuda` for run and bench: generation and speed runs on the CUDA backend (resident,
// layer and headinfer placements, --device-mem). A build without CUDA links cuda_backend_stub.cpp,
// whose functions fail with a message saying how to build with CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "run_common.h"
#include "runtime/model_files.h"
#include "runtime/sampler.h"

namespace kvtier::cli {

struct CudaRunArgs {
  int64_t n_predict = 128;
  bool ignore_eos = false;
  bool json = false;
};

// Prefills `prompt`, then samples up to n_predict tokens; prints the text (or one JSON object).
int run_generate_cuda(const EngineArgs& e, const runtime::LoadedModel& model,
                      std::span<const runtime::TokenId> prompt, const runtime::SamplerParams& sp,
                      const CudaRunArgs& a);

struct CudaBenchArgs {
  std::vector<int64_t> prompt_tokens;
  int64_t gen = 128;
  int repeat = 3;
  std::string policies;
  bool json = false;
};

// Prefill and greedy decode speed per prompt length and placement (medians of `repeat` rounds
// after one warm-up round), with the device named and the arena peak next to cudaMemGetInfo.
// e.model is a GGUF path or "synthetic:PRESET" (weights generated on the device, seed 0).
int run_bench_cuda(const EngineArgs& e, const CudaBenchArgs& a);

}  // namespace kvtier::cli
