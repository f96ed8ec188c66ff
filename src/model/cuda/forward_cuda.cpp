#include "model/cuda/forward_cuda.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "core/error.h"

namespace kvtier::model_cuda {
namespace {

uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}

int64_t widest_input(const model::ModelConfig& c) {
  return std::max({int64_t{c.n_embd}, int64_t{c.n_head} * c.head_dim_v, int64_t{c.n_ff}});
}

cuda::RopeMode rope_mode(cpu::RopeMode m) {
  return m == cpu::RopeMode::kNeox ? cuda::RopeMode::kNeox : cuda::RopeMode::kNormal;
}

}  // namespace

uint64_t ForwardCuda::activation_bytes(const model::ModelConfig& c, int64_t T, int64_t R) {
  const uint64_t hk = c.max_head_kv();
  const uint64_t floats = u(T) * (3 * uint64_t{c.n_embd} + 2 * uint64_t{c.n_head} * c.head_dim_k +
                                  2 * hk * c.head_dim_k + 2 * uint64_t{c.n_ff}) +
                          u(R) * c.n_vocab + uint64_t{c.n_head} * c.head_dim_k;
  return floats * 4 + u(T) * u(widest_input(c)) * 2 + u(T) * 8 + 16 * 256;  // + alignment of 15 buffers
}

uint64_t ForwardCuda::pinned_bytes(const model::ModelConfig& c, int64_t T, int64_t R) {
  return u(T) * 8 + u(R) * c.n_vocab * 4 + 3 * 4096;
}

ForwardCuda::ForwardCuda(cuda::Context& ctx, const model::ModelConfig& cfg, const DeviceWeights& w,
                         int64_t max_tokens, int64_t max_logit_rows, kv::MemoryLedger& ledger)
    : ctx_(ctx),
      cfg_(cfg),
      w_(w),
      max_tokens_(max_tokens),
      max_logit_rows_(max_logit_rows),
      s_(ctx.streams().compute.get()) {
  KVTIER_ASSERT(max_tokens > 0 && max_logit_rows > 0);
  if (cfg.arch == model::Arch::kOpt)
    fail(ErrorKind::kUnsupported, "CUDA forward: architecture opt is not supported yet (CPU only)");
  if (cfg.head_dim_k != cfg.head_dim_v) {
    fail(ErrorKind::kUnsupported, "CUDA forward: head_dim_k {} != head_dim_v {}", cfg.head_dim_k,
         cfg.head_dim_v);
  }
  const size_t T = u(max_tokens), R = u(max_logit_rows);
  const size_t E = cfg.n_embd, H = cfg.n_head, d = cfg.head_dim_k, hk = cfg.max_head_kv(), F = cfg.n_ff;
  auto& a = ctx.arena();
  const size_t mark = a.used();
  x_ = a.allocate<float>(T * E, "activations (residual)");
  xn_ = a.allocate<float>(T * E, "activations (normed)");
  q_ = a.allocate<float>(T * H * d, "activations (q)");
  k_ = a.allocate<float>(T * hk * d, "activations (k)");
  v_ = a.allocate<float>(T * hk * d, "activations (v)");
  att_ = a.allocate<float>(T * H * d, "activations (attention output)");
  tmp_ = a.allocate<float>(T * E, "activations (sub-block output)");
  gate_ = a.allocate<float>(T * F, "activations (ffn gate)");
  up_ = a.allocate<float>(T * F, "activations (ffn up)");
  xb_ = a.allocate<uint16_t>(T * u(widest_input(cfg)), "activations (bf16 GEMM input)");
  ids_ = a.allocate<int32_t>(T, "token ids");
  pos_ = a.allocate<int32_t>(T, "positions");
  logits_ = a.allocate<float>(R * cfg.n_vocab, "logits");
  q_next_ = a.allocate<float>(H * d, "activations (look-ahead q)");
  // The ledger counts what the arena gave (activation_bytes() is the estimate for planning, with
  // alignment slack; counting it would overstate the arena's use and trip the device budget).
  act_reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kActivations, a.used() - mark);
  auto& p = ctx.pinned();
  ids_host_ = p.allocate<int32_t>(T, "token id staging");
  pos_host_ = p.allocate<int32_t>(T, "position staging");
  logits_host_ = p.allocate<float>(R * cfg.n_vocab, "logits staging");
}

kv_cuda::DeviceKvShape device_kv_shape(const model::ModelConfig& cfg, int64_t max_positions,
                                       int64_t max_pass_tokens, cuda::KvDtype dtype) {
  kv_cuda::DeviceKvShape s;
  for (const auto& l : cfg.layers) s.n_head_kv.push_back(l.n_head_kv);
  s.head_dim = cfg.head_dim_k;
  s.dtype = dtype;
  s.max_positions = max_positions;
  s.max_pass_tokens = max_pass_tokens;
  s.max_q_heads = cfg.n_head;
  for (const auto& l : cfg.layers) s.window.push_back(l.window);
  return s;
}

kv_cuda::DeviceKvShape ForwardCuda::kv_shape(int64_t max_positions, cuda::KvDtype dtype) const {
  return device_kv_shape(cfg_, max_positions, max_tokens_, dtype);
}

void ForwardCuda::to_bf16(const float* x, int64_t n_elems) {
  cuda::cast_f32_to_bf16(x, n_elems, xb_, s_);
}

void ForwardCuda::gemm(const DeviceMatrix& m, const uint16_t* x_bf16, int64_t n, float* y) {
  cuda::gemm_bf16(ctx_.blas(), m.w, x_bf16, n, m.k, m.n_rows, y, s_);
}

cuda::RopeParams ForwardCuda::rope_params(uint32_t l) const {
  const model::RopeTableConfig& rt = cfg_.rope_tables[static_cast<size_t>(cfg_.layers[l].rope_table)];
  cuda::RopeParams rp;
  rp.head_dim = cfg_.head_dim_k;
  rp.n_rot = cfg_.n_rot;
  rp.base = rt.base;
  rp.freq_scale = rt.scale;
  rp.freq_factors = rt.use_freq_factors ? w_.rope_freqs : nullptr;
  rp.mode = rope_mode(cfg_.rope_mode);
  return rp;
}

void ForwardCuda::queries(uint32_t l, int64_t n, float* q) {
  const DeviceLayerWeights& L = w_.layers[l];
  const int64_t H = cfg_.n_head, d = cfg_.head_dim_k;
  gemm(L.wq, xb_, n, q);
  if (L.bq != nullptr) cuda::add_rows(q, H * d, L.bq, n, H * d, q, H * d, s_);
  if (cfg_.qk_norm) cuda::rms_norm(q, L.attn_q_norm, cfg_.rms_eps, n * H, d, q, s_);
  cuda::rope(rope_params(l), q, H * d, n, H, pos_, s_);
}

void ForwardCuda::layer(uint32_t l, int64_t n, kv_cuda::DeviceKvCache& kv) {
  const DeviceLayerWeights& L = w_.layers[l];
  const model::LayerConfig& lc = cfg_.layers[l];
  const int64_t E = cfg_.n_embd, H = cfg_.n_head, hk = lc.n_head_kv, d = cfg_.head_dim_k, F = cfg_.n_ff;
  const float eps = cfg_.rms_eps;

  // Attention block.
  cuda::rms_norm(x_, L.attn_norm, eps, n, E, xn_, s_);
  to_bf16(xn_, n * E);
  queries(l, n, q_);
  gemm(L.wk, xb_, n, k_);
  gemm(L.wv, xb_, n, v_);
  if (L.bk != nullptr) cuda::add_rows(k_, hk * d, L.bk, n, hk * d, k_, hk * d, s_);
  if (L.bv != nullptr) cuda::add_rows(v_, hk * d, L.bv, n, hk * d, v_, hk * d, s_);
  if (cfg_.qk_norm) cuda::rms_norm(k_, L.attn_k_norm, eps, n * hk, d, k_, s_);
  cuda::rope(rope_params(l), k_, hk * d, n, hk, pos_, s_);
  // InfiniGen's look-ahead: the next layer's queries from this layer's normed input (spec §6.2), so
  // that the KV cache speculates the rows it loads for that layer while this one runs.
  if (n == 1 && l + 1 < cfg_.n_layer && kv.wants_look_ahead(l + 1)) {
    queries(l + 1, 1, q_next_);
    kv.look_ahead(l + 1, q_next_, H, cfg_.attn_scale);
  }
  kv.write(l, k_, v_, hk * d);
  kv.attend(l, q_, H, {cfg_.attn_scale, cfg_.attn_softcap, lc.window}, att_);
  to_bf16(att_, n * H * d);
  gemm(L.wo, xb_, n, tmp_);
  if (L.post_attn_norm != nullptr) cuda::rms_norm(tmp_, L.post_attn_norm, eps, n, E, tmp_, s_);
  cuda::add(x_, tmp_, n * E, x_, s_);

  // Feed-forward block: act(gate) * up, then down.
  cuda::rms_norm(x_, L.ffn_norm, eps, n, E, xn_, s_);
  to_bf16(xn_, n * E);
  gemm(L.gate, xb_, n, gate_);
  gemm(L.up, xb_, n, up_);
  const cuda::GluAct act =
      cfg_.act == model::FfnActivation::kSilu ? cuda::GluAct::kSilu : cuda::GluAct::kGeluTanh;
  cuda::glu(act, gate_, F, up_, F, n, F, gate_, F, s_);
  to_bf16(gate_, n * F);
  gemm(L.down, xb_, n, tmp_);
  if (L.post_ffn_norm != nullptr) cuda::rms_norm(tmp_, L.post_ffn_norm, eps, n, E, tmp_, s_);
  cuda::add(x_, tmp_, n * E, x_, s_);
}

void ForwardCuda::run(std::span<const TokenId> tokens, int64_t pos0, kv_cuda::DeviceKvCache& kv,
                      LogitRows rows, float* logits) {
  const auto n = static_cast<int64_t>(tokens.size());
  KVTIER_ASSERT(n > 0 && n <= max_tokens_, "{} tokens for a forward pass of at most {}", n, max_tokens_);
  KVTIER_ASSERT(pos0 == kv.length(), "forward at position {} with {} positions cached", pos0, kv.length());
  KVTIER_ASSERT(rows != LogitRows::kStates, "the CUDA forward pass gives logits, not states");
  KVTIER_ASSERT(rows != LogitRows::kAll || n <= max_logit_rows_, "logits of {} rows, at most {}", n,
                max_logit_rows_);
  if (pos0 + n > kv.capacity()) {
    fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", kv.capacity(),
         pos0 + n);
  }
  for (TokenId id : tokens) {
    if (id < 0 || static_cast<uint32_t>(id) >= cfg_.n_vocab)
      fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id, cfg_.n_vocab);
  }
  // The staging of the previous pass's inputs must have been read before it is overwritten.
  ev_inputs_.synchronize();
  for (int64_t t = 0; t < n; ++t) {
    ids_host_[t] = tokens[static_cast<size_t>(t)];
    pos_host_[t] = static_cast<int32_t>(pos0 + t);
  }
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(ids_, ids_host_, u(n) * 4, cudaMemcpyHostToDevice, s_));
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(pos_, pos_host_, u(n) * 4, cudaMemcpyHostToDevice, s_));
  ev_inputs_.record(s_);

  const int64_t E = cfg_.n_embd;
  cuda::embedding_bf16(w_.tok_embd.w, ids_, n, E, cfg_.embd_scale, x_, s_);
  kv.begin_pass(pos0, n);
  for (uint32_t l = 0; l < cfg_.n_layer; ++l) layer(l, n, kv);
  kv.end_pass();
  if (rows == LogitRows::kNone) return;

  const int64_t first = rows == LogitRows::kLast ? n - 1 : 0;
  const int64_t m = n - first;
  const int64_t V = cfg_.n_vocab;
  cuda::rms_norm(x_ + first * E, w_.output_norm, cfg_.rms_eps, m, E, xn_, s_);
  to_bf16(xn_, m * E);
  gemm(w_.output, xb_, m, logits_);
  if (cfg_.final_softcap > 0.0f) cuda::softcap(logits_, cfg_.final_softcap, m * V, logits_, s_);
  const size_t bytes = u(m * V) * sizeof(float);
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(logits_host_, logits_, bytes, cudaMemcpyDeviceToHost, s_));
  KVTIER_CUDA_CHECK(cudaStreamSynchronize(s_));
  std::memcpy(logits, logits_host_, bytes);
}

}  // namespace kvtier::model_cuda
