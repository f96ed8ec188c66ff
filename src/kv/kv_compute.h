// The model-side compute hook a KV policy may call: project K and V of a layer from stored layer
// inputs. Declared here, implemented by the model (model::Forward), so that `kv` never depends on
// `model`. The model's own forward pass computes new tokens' K and V through the very same code, so
// recomputed rows are the same bits as the rows a pass wrote (recompute policies rely on it).
#pragma once

#include <cstdint>
#include <span>

namespace kvtier::kv {

class KvCompute {
 public:
  virtual ~KvCompute() = default;
  // K and V of `layer` for the tokens whose K/V-projection inputs are x, at the given positions
  // (their RoPE angles), n = positions.size() tokens, at most max_rows():
  //   x: [n, n_embd] f32 (the rows LayerRows::x carried)
  //   k: [n, n_head_kv(layer), head_dim_k] f32 after RoPE    v: [n, n_head_kv(layer), head_dim_v] f32
  virtual void project_kv(uint32_t layer, const float* x, std::span<const int64_t> positions, float* k,
                          float* v) = 0;
  // The queries of `layer` rotated to one position: out[t] = RoPE(q_pre[t], position) with the model's
  // RoPE of that layer, n <= max_rows() tokens (StreamingLLM places the attention sinks at positions
  // within the cache: the queries that attend them are re-rotated):
  //   q_pre, out: [n, n_head, head_dim_k] f32 (q_pre: the rows LayerRows::q_pre carried)
  virtual void rope_q(uint32_t layer, const float* q_pre, int64_t n, int64_t position, float* out) = 0;
  // The queries of `layer` for the tokens whose projection inputs are x, at the given positions: the
  // pass's own code (bias, QK-norm, RoPE), n = positions.size() <= max_rows() tokens. InfiniGen's
  // look-ahead feeds layer l-1's input through layer l's projection (spec infinigen.md §6.2):
  //   x: [n, n_embd] f32    q: [n, n_head, head_dim_k] f32 after RoPE
  // The default refuses: a hook that cannot project queries says so.
  virtual void project_q(uint32_t layer, const float* x, std::span<const int64_t> positions, float* q);
  // Single KV-head key rows of `layer` rotated each to its own position: out[t] = RoPE(k_pre[t],
  // positions[t]) with the model's RoPE of that layer (Locret renumbers retained keys compactly after
  // an eviction), n = positions.size() <= max_rows(). A position may be negative: RoPE turns each
  // pair by an angle linear in the position, so RoPE(RoPE(k, p), d) = RoPE(k, p + d) up to rounding,
  // which locret's --locret-keys rerotate uses to move a key from row p to row p + d:
  //   k_pre, out: [n, head_dim_k] f32 (k_pre: rows of LayerRows::k_pre, or keys after RoPE, one KV head each)
  // The default refuses.
  virtual void rope_k_rows(uint32_t layer, const float* k_pre, std::span<const int64_t> positions,
                           float* out);
  virtual int64_t max_rows() const = 0;

  // KVPR keeps the K/V-projection inputs of a prefix of positions in the form the projections consume
  // (KvGeometry::act_row_bytes[layer] bytes per token) and recomputes their K/V from them:
  //   x: [n, n_embd] f32 -> out: [n, act_row_bytes(layer)]    (n <= max_rows())
  virtual void encode_inputs(uint32_t layer, const float* x, int64_t n, uint8_t* out);
  // K and V of KV heads [head0, head0 + n_heads) of `layer` from encoded inputs, the same bits as the
  // rows a pass wrote for those tokens at those positions (n = positions.size() <= max_rows()):
  //   act: [n, act_row_bytes(layer)]
  //   k: [n, n_heads, head_dim_k] f32 after RoPE    v: [n, n_heads, head_dim_v] f32
  virtual void project_kv_encoded(uint32_t layer, const uint8_t* act, std::span<const int64_t> positions,
                                  uint32_t head0, uint32_t n_heads, float* k, float* v);
};

}  // namespace kvtier::kv
