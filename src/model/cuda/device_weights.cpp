#include "model/cuda/device_weights.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/weight_upload.h"
#include "core/error.h"

namespace kvtier::model_cuda {
namespace {

constexpr uint64_t kAlign = 256;  // the arena's alignment

uint64_t aligned(uint64_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

// Calls fn(bytes) for every tensor upload_weights carves, in the same order.
template <typename Fn>
void for_each_tensor_bytes(const model::ModelConfig& cfg, const model::ModelWeights& w, Fn&& fn) {
  auto mat = [&](const cpu::WeightMatrix& m) { fn(static_cast<uint64_t>(m.n_rows * m.k) * 2); };
  auto vec = [&](const float* p, uint64_t n) {
    if (p != nullptr) fn(n * 4);
  };
  mat(w.tok_embd);
  vec(w.output_norm, cfg.n_embd);
  if (!w.tied_output) mat(w.output);
  vec(w.rope_freqs, cfg.n_rot / 2);
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {
    const model::LayerWeights& L = w.layers[l];
    const uint64_t hk = cfg.layers[l].n_head_kv;
    vec(L.attn_norm, cfg.n_embd);
    vec(L.attn_q_norm, cfg.head_dim_k);
    vec(L.attn_k_norm, cfg.head_dim_k);
    vec(L.post_attn_norm, cfg.n_embd);
    vec(L.ffn_norm, cfg.n_embd);
    vec(L.post_ffn_norm, cfg.n_embd);
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) mat(*m);
    vec(L.bq, uint64_t{cfg.n_head} * cfg.head_dim_k);
    vec(L.bk, hk * cfg.head_dim_k);
    vec(L.bv, hk * cfg.head_dim_v);
  }
}

class Uploader {
 public:
  Uploader(cuda::Context& ctx) : ctx_(ctx) {}

  DeviceMatrix matrix(const cpu::WeightMatrix& m, const char* what) {
    DeviceMatrix d;
    d.n_rows = m.n_rows;
    d.k = m.k;
    auto* p = ctx_.arena().allocate<uint16_t>(static_cast<size_t>(m.n_rows * m.k), what);
    cuda::upload_weight_bf16(m.type, m.data, m.n_rows, m.k, p, ctx_.pinned(), kUploadStagingBytes,
                             ctx_.streams().compute.get());
    bytes_ += aligned(static_cast<uint64_t>(m.n_rows * m.k) * 2);
    d.w = p;
    return d;
  }

  const float* vector(const float* host, uint64_t n, const char* what) {
    if (host == nullptr) return nullptr;
    auto* p = ctx_.arena().allocate<float>(n, what);
    KVTIER_CUDA_CHECK(cudaMemcpy(p, host, n * sizeof(float), cudaMemcpyHostToDevice));
    bytes_ += aligned(n * 4);
    return p;
  }

  uint64_t bytes() const { return bytes_; }

 private:
  cuda::Context& ctx_;
  uint64_t bytes_ = 0;
};

}  // namespace

uint64_t device_weight_bytes(const model::ModelConfig& cfg, const model::ModelWeights& w) {
  uint64_t total = 0;
  for_each_tensor_bytes(cfg, w, [&](uint64_t b) { total += aligned(b); });
  return total;
}

DeviceWeights upload_weights(cuda::Context& ctx, const model::ModelConfig& cfg, const model::ModelWeights& w,
                             kv::MemoryLedger& ledger) {
  if (cfg.arch == model::Arch::kOpt)
    fail(ErrorKind::kUnsupported, "CUDA backend: architecture opt is not supported yet (CPU only)");
  DeviceWeights d;
  d.reservation =
      kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kWeights, device_weight_bytes(cfg, w));
  Uploader up(ctx);
  d.tok_embd = up.matrix(w.tok_embd, "token embeddings");
  d.output_norm = up.vector(w.output_norm, cfg.n_embd, "output norm");
  d.output = w.tied_output ? d.tok_embd : up.matrix(w.output, "output projection");
  d.rope_freqs = up.vector(w.rope_freqs, cfg.n_rot / 2, "rope frequency factors");
  for (uint32_t l = 0; l < cfg.n_layer; ++l) {
    const model::LayerWeights& L = w.layers[l];
    const uint64_t hk = cfg.layers[l].n_head_kv;
    DeviceLayerWeights D;
    D.attn_norm = up.vector(L.attn_norm, cfg.n_embd, "attention norm");
    D.attn_q_norm = up.vector(L.attn_q_norm, cfg.head_dim_k, "q norm");
    D.attn_k_norm = up.vector(L.attn_k_norm, cfg.head_dim_k, "k norm");
    D.post_attn_norm = up.vector(L.post_attn_norm, cfg.n_embd, "post-attention norm");
    D.ffn_norm = up.vector(L.ffn_norm, cfg.n_embd, "ffn norm");
    D.post_ffn_norm = up.vector(L.post_ffn_norm, cfg.n_embd, "post-ffn norm");
    D.wq = up.matrix(L.wq, "attention q weights");
    D.wk = up.matrix(L.wk, "attention k weights");
    D.wv = up.matrix(L.wv, "attention v weights");
    D.wo = up.matrix(L.wo, "attention output weights");
    D.gate = up.matrix(L.gate, "ffn gate weights");
    D.up = up.matrix(L.up, "ffn up weights");
    D.down = up.matrix(L.down, "ffn down weights");
    D.bq = up.vector(L.bq, uint64_t{cfg.n_head} * cfg.head_dim_k, "q bias");
    D.bk = up.vector(L.bk, hk * cfg.head_dim_k, "k bias");
    D.bv = up.vector(L.bv, hk * cfg.head_dim_v, "v bias");
    d.layers.push_back(D);
  }
  d.bytes = up.bytes();
  return d;
}

}  // namespace kvtier::model_cuda
