// The decoder forward pass of the supported architectures (llama, qwen2, gemma3) on the CPU backend.
// One layer loop serves all of them, switched by ModelConfig; KV goes through kv::KvCache's pass
// protocol (the cache gives the positions of the new tokens).
//
//   x = embed(tokens) * embd_scale
//   per layer: h = norm(x); q,k,v = h W (+b); [qk-norm]; rope(q, k); kv.write(k, v); o = kv.attend(q)
//              a = o Wo; [post-norm]; x += a; h = norm(x); f = (act(h Wg) * h Wu) Wd; [post-norm]; x += f
//   logits = norm(x) Wout [softcap]
//
// All buffers are sized at construction for up to max_tokens tokens per call; run() allocates nothing.
// A pass may carry the tokens of several sequences (run_batch): every matmul runs once over all of
// them (a decode step of B sequences reads each weight once), each sequence attends its own KV. The
// matmul and attention kernels give each row the bits it gets alone (matmul.h, attention.h), so a
// sequence's results do not depend on what else is in the batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_compute.h"
#include "kv/ledger.h"
#include "model/config.h"
#include "model/weight_stream.h"
#include "model/weights.h"

namespace kvtier::model {

using TokenId = int32_t;

enum class LogitRows {
  kNone,  // only fill the KV cache
  kLast,  // logits of the last token: [1, n_vocab]
  kAll,   // logits of every token: [n_tokens, n_vocab]
  // no logits; the output-normed hidden state of every token, the output projection's input, in
  // Forward::states() (bit-identity checks at every position without the [n_tokens, n_vocab] product:
  // equal states give equal logits). A single-part pass only.
  kStates,
};

// Sizes of Forward's buffers for passes of up to max_tokens tokens (T). The constructor allocates
// exactly these, and planners predict the engine's activation memory from them.
struct ForwardBuffers {
  size_t x = 0, xn = 0, tmp = 0;      // [T, n_embd] f32 elements each
  size_t q = 0, att = 0;              // [T, n_head, head_dim_k|v] f32 elements
  size_t k = 0, v = 0;                // [T, max n_head_kv, head_dim_k|v] f32 elements
  size_t gate = 0, up = 0;            // [T, n_ff] f32 elements
  size_t cos = 0, sin = 0;            // [n_tables, T, n_rot / 2] f32 elements
  size_t q_pre = 0, k_pre = 0;        // kNeedPreRope: [T, n_head | max n_head_kv, head_dim_k] f32 elements
  size_t hook_cos = 0, hook_sin = 0;  // the compute hook's angles (kv needs set): [T, n_rot / 2] f32
  size_t matmul_bytes = 0;            // activations quantised for the widest matmul, bytes
  // All of them, in bytes (the ledger's activations of the forward pass).
  uint64_t bytes() const;
};
// kv_needs: the KvNeed bits of the cache the passes will use (extra rows are sized only when asked).
ForwardBuffers forward_buffers(const ModelConfig& cfg, const ModelWeights& w, int64_t max_tokens,
                               uint32_t kv_needs = 0);

// The KV geometry of a model (block size and dtype as given; group_heads 0: all of a layer's heads).
kv::KvGeometry kv_geometry(const ModelConfig& cfg, uint32_t block_tokens, cpu::KvDtype dtype,
                           uint32_t group_heads = 0);

// Bytes per token of each layer's stored K/V-projection inputs (KVPR, kv::KvCompute::encode_inputs):
// the activation rows the K and V projections quantise to, when both use one format; else f32 rows.
std::vector<uint64_t> kv_input_row_bytes(const ModelConfig& cfg, const ModelWeights& w);

// One sequence's part of a batched pass, and the logits it wants.
struct SeqTokens {
  kv::SeqId seq = 0;
  std::span<const TokenId> tokens;
  LogitRows rows = LogitRows::kLast;
};

// Rows of logits a part produces: 0, 1 or its token count.
int64_t logit_rows(const SeqTokens& s);

class Forward final : public kv::KvCompute {
 public:
  // kv_needs: the KvNeed bits of the caches this Forward will run with.
  Forward(const ModelConfig& cfg, const ModelWeights& w, int64_t max_tokens, ThreadPool& pool, cpu::Isa isa,
          kv::MemoryLedger& ledger, uint32_t kv_needs = 0);

  // Runs one pass of `tokens` of sequence `seq` (at the positions the cache gives) and writes the
  // requested logits. A failure aborts the cache's pass (the sequence is as before) and rethrows.
  void run(std::span<const TokenId> tokens, kv::SeqId seq, kv::KvCache& kv, LogitRows rows, float* logits);
  // One pass over the tokens of several distinct sequences (at most max_tokens in all). logits: the
  // parts' logit rows concatenated in order ([sum logit_rows(part), n_vocab] f32). A failure aborts
  // the pass for all of them (each sequence is as before) and rethrows.
  void run_batch(std::span<const SeqTokens> parts, kv::KvCache& kv, float* logits);
  // The states of the last pass run with LogitRows::kStates: [n_tokens, n_embd] f32, valid until the
  // next pass.
  std::span<const float> states() const {
    return {xn_.data(), static_cast<size_t>(states_rows_ * cfg_.n_embd)};
  }
  // The logits of m output-normed rows (states() rows or a copy): [m, n_vocab] f32, the same bits a
  // pass's logits have.
  void output(const float* states, int64_t m, float* logits);

  // kv::KvCompute: the same projection code a pass uses for its new tokens. Needs kv_needs != 0.
  void project_kv(uint32_t layer, const float* x, std::span<const int64_t> positions, float* k,
                  float* v) override;
  void rope_q(uint32_t layer, const float* q_pre, int64_t n, int64_t position, float* out) override;
  void project_q(uint32_t layer, const float* x, std::span<const int64_t> positions, float* q) override;
  void rope_k_rows(uint32_t layer, const float* k_pre, std::span<const int64_t> positions,
                   float* out) override;
  int64_t max_rows() const override { return max_tokens_; }
  void encode_inputs(uint32_t layer, const float* x, int64_t n, uint8_t* out) override;
  void project_kv_encoded(uint32_t layer, const uint8_t* act, std::span<const int64_t> positions,
                          uint32_t head0, uint32_t n_heads, float* k, float* v) override;

  int64_t max_tokens() const { return max_tokens_; }
  const ModelConfig& config() const { return cfg_; }
  // Streams the non-resident layers' weights through `s` (null: every weight resident). The
  // streamer must outlive the passes.
  void set_weight_stream(WeightStreamer* s) { stream_ = s->streams() ? s : nullptr; }
  // A KV geometry for this model (block size and dtype as given).
  kv::KvGeometry kv_geometry(uint32_t block_tokens, cpu::KvDtype dtype, uint32_t group_heads = 0) const;

 private:
  void matmul(const cpu::WeightMatrix& w, const float* x, int64_t n, float* y);
  // The model's norm of one row [n_embd]: RMSNorm (w), or LayerNorm (w, b) for OPT.
  void norm(const float* x, const float* w, const float* b, float* y);
  void layer(uint32_t l, int64_t n, kv::KvCache& kv);
  // Bias, QK-norm and RoPE of token t's q (H heads) or k (hk heads), in place; the pre-RoPE rows are
  // copied to pre (if not null) first. cos/sin: the token's angles.
  void finish_q(const LayerWeights& L, float* q, const float* cos, const float* sin, float* pre);
  void finish_kv(const LayerWeights& L, uint32_t l, float* k, float* v, const float* cos, const float* sin,
                 float* pre);
  // finish_kv of KV heads [head0, head0 + n_heads) only (k, v: those heads' rows); the same bits.
  void finish_kv_heads(const LayerWeights& L, uint32_t head0, uint32_t n_heads, float* k, float* v,
                       const float* cos, const float* sin);
  void for_tokens(int64_t n, const std::function<void(int64_t)>& fn);
  // The weights of layer l as the compute sees them now (staged when streamed).
  const LayerWeights& lw(uint32_t l) const { return stream_ != nullptr ? stream_->current(l) : w_.layers[l]; }

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  int64_t max_tokens_;
  ThreadPool& pool_;
  cpu::Isa isa_;
  uint32_t kv_needs_;
  WeightStreamer* stream_ = nullptr;
  kv::Reservation reservation_;
  // Activation buffers (T = max_tokens_):
  std::vector<float> x_;             // [T, n_embd] f32: residual stream
  std::vector<float> xn_;            // [T, n_embd] f32: normed input of a sub-block
  int64_t states_rows_ = 0;          // rows of xn_ holding kStates output (0: none)
  std::vector<float> q_;             // [T, n_head, head_dim_k] f32
  std::vector<float> k_;             // [T, n_head_kv, head_dim_k] f32
  std::vector<float> v_;             // [T, n_head_kv, head_dim_v] f32
  std::vector<float> att_;           // [T, n_head, head_dim_v] f32
  std::vector<float> tmp_;           // [T, n_embd] f32: sub-block output
  std::vector<float> gate_;          // [T, n_ff] f32
  std::vector<float> up_;            // [T, n_ff] f32
  std::vector<float> cos_;           // [n_tables, T, n_rot / 2] f32
  std::vector<float> sin_;           // [n_tables, T, n_rot / 2] f32
  std::vector<float> q_pre_;         // kNeedPreRope: [T, n_head, head_dim_k] f32
  std::vector<float> k_pre_;         // kNeedPreRope: [T, n_head_kv, head_dim_k] f32
  std::vector<float> hook_cos_;      // kv needs: [T, n_rot / 2] f32, angles of project_kv
  std::vector<float> hook_sin_;      // kv needs: [T, n_rot / 2] f32
  std::vector<uint8_t> mm_scratch_;  // quantised activations of the widest matmul
  std::vector<kv::PassInfo> batch_;  // [parts] of the current pass (capacity kept across passes)
  std::vector<int64_t> part_row0_;   // [parts] first row of each part in the pass
  std::vector<int64_t> token_part_;  // [T] part index of each token of the pass
  std::vector<int64_t> logit_src_;   // [T] the pass row each logit row comes from
};

}  // namespace kvtier::model
