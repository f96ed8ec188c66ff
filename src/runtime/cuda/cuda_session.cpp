#include "runtime/cuda/cuda_session.h"

#include <algorithm>

#include "backend/cuda/device.h"
#include "core/error.h"
#include "kv/cuda/make_device_kv.h"

namespace kvtier::runtime_cuda {

bool cuda_device_available() {
  return !cuda::list_devices().empty();
}

CudaSession::CudaSession(const runtime::LoadedModel& model, const CudaSessionOptions& opt)
    : cfg_(model.config), opt_(opt) {
  init([&](cuda::Context& ctx, kv::MemoryLedger& ledger) {
    return model_cuda::upload_weights(ctx, model.config, model.weights, ledger);
  });
}

CudaSession::CudaSession(const model::ModelConfig& cfg, const model::Preset& preset,
                         const model::SynthOptions& so, const CudaSessionOptions& opt)
    : cfg_(cfg), opt_(opt) {
  init([&](cuda::Context& ctx, kv::MemoryLedger& ledger) {
    return model_cuda::synth_device_weights(ctx, preset, so, ledger);
  });
}

void CudaSession::init(const MakeWeights& make_weights) {
  const auto devices = cuda::list_devices();
  if (devices.empty()) fail(ErrorKind::kUnsupported, "--backend cuda: no CUDA device on this machine");
  if (opt_.device < 0 || static_cast<size_t>(opt_.device) >= devices.size()) {
    fail(ErrorKind::kInvalidArgument, "CUDA device {} does not exist ({} visible)", opt_.device,
         devices.size());
  }
  const model::ModelConfig& cfg = cfg_;
  if (opt_.n_ctx <= 0) opt_.n_ctx = cfg.n_ctx_train;
  KVTIER_ASSERT(opt_.chunk > 0);
  opt_.chunk = std::min(opt_.chunk, opt_.n_ctx);

  // The pinned pool is sized up front: the host KV planes, the upload staging, the token/logits staging.
  const kv_cuda::DeviceKvShape shape =
      model_cuda::device_kv_shape(cfg, opt_.n_ctx, opt_.chunk, opt_.kv_dtype);
  const uint64_t pinned = kv_cuda::device_kv_host_bytes(shape, opt_.kv) + model_cuda::kUploadStagingBytes +
                          model_cuda::ForwardCuda::pinned_bytes(cfg, opt_.chunk, 1) + (uint64_t{1} << 20);
  cuda::ContextOptions co;
  co.device = opt_.device;
  co.device_budget =
      opt_.device_mem != 0 ? opt_.device_mem : devices[static_cast<size_t>(opt_.device)].free_bytes / 10 * 9;
  co.pinned_bytes = pinned;
  ledger_.set_budget(kv::Tier::kDevice, co.device_budget);
  ctx_ = std::make_unique<cuda::Context>(co);
  blas_reservation_ =
      kv::Reservation(ledger_, kv::Tier::kDevice, kv::Category::kScratch, cuda::Blas::kWorkspaceBytes);
  weights_ = std::make_unique<model_cuda::DeviceWeights>(make_weights(*ctx_, ledger_));
  forward_ = std::make_unique<model_cuda::ForwardCuda>(*ctx_, cfg, *weights_, opt_.chunk, 1, ledger_);
  kv_ = kv_cuda::make_device_kv(*ctx_, forward_->kv_shape(opt_.n_ctx, opt_.kv_dtype), opt_.kv, ledger_);
  logits_.resize(cfg.n_vocab);
}

CudaSession::~CudaSession() {
  // Work still queued on the streams refers to the arena and the pinned pool.
  if (ctx_) {
    cudaStreamSynchronize(ctx_->streams().compute.get());
    cudaStreamSynchronize(ctx_->streams().h2d.get());
    cudaStreamSynchronize(ctx_->streams().d2h.get());
  }
}

std::span<const float> CudaSession::prefill(std::span<const TokenId> tokens) {
  KVTIER_ASSERT(!tokens.empty());
  for (size_t i = 0; i < tokens.size(); i += static_cast<size_t>(opt_.chunk)) {
    const size_t n = std::min(tokens.size() - i, static_cast<size_t>(opt_.chunk));
    const bool last = i + n == tokens.size();
    forward_->run(tokens.subspan(i, n), kv_->length(), *kv_,
                  last ? model::LogitRows::kLast : model::LogitRows::kNone, logits_.data());
  }
  return logits_;
}

std::span<const float> CudaSession::decode(TokenId token) {
  const TokenId t[1] = {token};
  forward_->run(t, kv_->length(), *kv_, model::LogitRows::kLast, logits_.data());
  return logits_;
}

void CudaSession::truncate(int64_t n) {
  kv_->truncate(n);
}

}  // namespace kvtier::runtime_cuda
