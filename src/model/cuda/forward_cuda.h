// The decoder forward pass (llama, qwen2, gemma3) on the CUDA backend: the layer loop of
// model/forward.h with the same structure and numerics switches (norm eps, RoPE tables and pairing,
// QK-norm, post-norms, embedding scale, soft-caps, SwiGLU/GeGLU), on device buffers:
//   x = embed(tokens) * embd_scale
//   per layer: h = norm(x); q,k,v = h W (+b); [qk-norm]; rope(q, k); kv.write(k, v); o = kv.attend(q)
//              a = o Wo; [post-norm]; x += a; h = norm(x); f = (act(h Wg) * h Wu) Wd; [post-norm]; x += f
//   logits = norm(x) Wout [softcap]   -> copied to the host for the CPU sampler
// Matrices are bf16 with f32 accumulation (cuBLAS); activations stay f32. Every buffer is carved from
// the arena at construction for up to max_tokens tokens per call; run() allocates nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "backend/cuda/context.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/stream.h"
#include "kv/cuda/device_kv.h"
#include "kv/ledger.h"
#include "model/config.h"
#include "model/cuda/device_weights.h"
#include "model/forward.h"

namespace kvtier::model_cuda {

using model::LogitRows;
using model::TokenId;

// The device KV shape of a model for passes of up to max_pass_tokens tokens.
kv_cuda::DeviceKvShape device_kv_shape(const model::ModelConfig& cfg, int64_t max_positions,
                                       int64_t max_pass_tokens, cuda::KvDtype dtype);

class ForwardCuda {
 public:
  // max_logit_rows: rows LogitRows::kAll may ask for (>= 1; kLast needs 1).
  ForwardCuda(cuda::Context& ctx, const model::ModelConfig& cfg, const DeviceWeights& w, int64_t max_tokens,
              int64_t max_logit_rows, kv::MemoryLedger& ledger);

  // Runs tokens at positions [pos0, pos0 + n) (pos0 == kv.length()) and, unless rows == kNone, waits
  // for the compute stream and writes the requested logits to `logits` (host, [rows, n_vocab] f32).
  void run(std::span<const TokenId> tokens, int64_t pos0, kv_cuda::DeviceKvCache& kv, LogitRows rows,
           float* logits);

  int64_t max_tokens() const { return max_tokens_; }
  const model::ModelConfig& config() const { return cfg_; }

  // The KV shape of this model (device_kv_shape with this forward's pass size).
  kv_cuda::DeviceKvShape kv_shape(int64_t max_positions, cuda::KvDtype dtype) const;

  // Device bytes of the activation buffers and pinned host bytes of the token / logits staging.
  static uint64_t activation_bytes(const model::ModelConfig& cfg, int64_t max_tokens, int64_t max_logit_rows);
  static uint64_t pinned_bytes(const model::ModelConfig& cfg, int64_t max_tokens, int64_t max_logit_rows);

 private:
  void layer(uint32_t l, int64_t n, kv_cuda::DeviceKvCache& kv);
  // Layer l's queries of the rows in xb_ (the bf16 normed input): q = RoPE(norm(xb Wq + bq)).
  void queries(uint32_t l, int64_t n, float* q);
  cuda::RopeParams rope_params(uint32_t l) const;
  void gemm(const DeviceMatrix& m, const uint16_t* x_bf16, int64_t n, float* y);
  void to_bf16(const float* x, int64_t n_elems);  // x -> xb_

  cuda::Context& ctx_;
  const model::ModelConfig& cfg_;
  const DeviceWeights& w_;
  int64_t max_tokens_;
  int64_t max_logit_rows_;
  cudaStream_t s_;
  kv::Reservation act_reservation_;
  // Device buffers (T = max_tokens_, R = max_logit_rows_):
  float* x_ = nullptr;       // [T, n_embd] f32: residual stream
  float* xn_ = nullptr;      // [T, n_embd] f32: normed input of a sub-block
  float* q_ = nullptr;       // [T, n_head, head_dim] f32
  float* k_ = nullptr;       // [T, n_head_kv_max, head_dim] f32
  float* v_ = nullptr;       // [T, n_head_kv_max, head_dim] f32
  float* att_ = nullptr;     // [T, n_head, head_dim] f32
  float* tmp_ = nullptr;     // [T, n_embd] f32: sub-block output
  float* gate_ = nullptr;    // [T, n_ff] f32
  float* up_ = nullptr;      // [T, n_ff] f32
  uint16_t* xb_ = nullptr;   // [T, max(n_embd, n_head * head_dim, n_ff)] bf16: GEMM input
  int32_t* ids_ = nullptr;   // [T] i32
  int32_t* pos_ = nullptr;   // [T] i32
  float* logits_ = nullptr;  // [R, n_vocab] f32
  float* q_next_ = nullptr;  // [n_head, head_dim] f32: the next layer's queries (InfiniGen look-ahead)
  // Pinned host staging:
  int32_t* ids_host_ = nullptr;   // [T] i32
  int32_t* pos_host_ = nullptr;   // [T] i32
  float* logits_host_ = nullptr;  // [R, n_vocab] f32
  cuda::Event ev_inputs_;         // the last token/position upload has been read
};

}  // namespace kvtier::model_cuda
