// One sequence evaluated on the CUDA backend: the device context (arena of --device-mem, pinned
// pool, streams, cuBLAS), the model's weights on the device, the forward pass, the GPU KV cache of
// the chosen placement, the ledger and the host logits. Chunked prefill and single-token decode, as
// runtime::Session on the CPU. Everything is sized at construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/context.h"
#include "kv/cuda/device_kv.h"
#include "kv/ledger.h"
#include "model/cuda/device_weights.h"
#include "model/cuda/forward_cuda.h"
#include "model/cuda/synth_weights.h"
#include "runtime/model_files.h"

namespace kvtier::runtime_cuda {

using model::TokenId;

struct CudaSessionOptions {
  int device = 0;
  uint64_t device_mem = 0;  // arena budget (--device-mem); 0: 90% of the device's free memory
  int64_t n_ctx = 0;        // positions the KV cache holds (0: the model's training context)
  int64_t chunk = 512;      // prefill chunk (tokens per forward pass)
  cuda::KvDtype kv_dtype = cuda::KvDtype::kF16;
  kv_cuda::DeviceKvOptions kv;  // placement, staging bytes, debug delays
};

class CudaSession {
 public:
  // Throws Error(kUnsupported) when there is no CUDA device, Error(kBudget) when the weights,
  // activations and KV do not fit --device-mem or pinning fails.
  CudaSession(const runtime::LoadedModel& model, const CudaSessionOptions& opt);
  // An in-memory synthetic model (--model synthetic:NAME): weights generated on the device. `cfg`
  // (make_config(preset_hparams(preset, so))) must outlive the session.
  CudaSession(const model::ModelConfig& cfg, const model::Preset& preset, const model::SynthOptions& so,
              const CudaSessionOptions& opt);
  ~CudaSession();

  // Appends tokens through chunked prefill; returns the logits after the last one ([n_vocab]).
  std::span<const float> prefill(std::span<const TokenId> tokens);
  // Appends one token; returns its logits.
  std::span<const float> decode(TokenId token);
  void truncate(int64_t n);

  int64_t n_past() const { return kv_->length(); }
  int64_t n_ctx() const { return kv_->capacity(); }
  int64_t chunk() const { return opt_.chunk; }
  const kv::MemoryLedger& ledger() const { return ledger_; }
  cuda::MemoryReport memory_report() const { return ctx_->memory_report(); }
  kv_cuda::DeviceKvStats kv_stats() const { return kv_->stats(); }
  // The KV cache (tests inspect a placement's state between passes).
  const kv_cuda::DeviceKvCache& kv_cache() const { return *kv_; }
  // The device context (streams, arena, pinned pool): for probes between passes, not during one.
  cuda::Context& context() { return *ctx_; }

 private:
  using MakeWeights = std::function<model_cuda::DeviceWeights(cuda::Context&, kv::MemoryLedger&)>;
  void init(const MakeWeights& make_weights);

  const model::ModelConfig& cfg_;
  CudaSessionOptions opt_;
  kv::MemoryLedger ledger_;
  std::unique_ptr<cuda::Context> ctx_;
  kv::Reservation blas_reservation_;  // the cuBLAS workspace the context carved from the arena
  std::unique_ptr<model_cuda::DeviceWeights> weights_;
  std::unique_ptr<model_cuda::ForwardCuda> forward_;
  std::unique_ptr<kv_cuda::DeviceKvCache> kv_;
  std::vector<float> logits_;  // [n_vocab] f32
};

// Whether a CUDA device is usable here (the CLI and the GPU tests check this first).
bool cuda_device_available();

}  // namespace kvtier::runtime_cuda
