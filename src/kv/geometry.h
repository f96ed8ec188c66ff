// Shape of a model's KV cache and of its blocks. A block holds K and V of `block_tokens`
// consecutive positions for one group of KV heads of one layer:
//   K: [group_heads][block_tokens, head_dim_k] dtype, then V: [group_heads][block_tokens, head_dim_v]
// so each head's rows are contiguous and a group's history streams as few large runs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/attention.h"

namespace kvtier::kv {

using cpu::KvDtype;

struct KvGeometry {
  std::vector<uint32_t> n_head_kv;  // [n_layer] KV heads per layer
  uint32_t head_dim_k = 0;
  uint32_t head_dim_v = 0;
  uint32_t block_tokens = 256;  // a multiple of cpu::kAttnTile
  uint32_t group_heads = 0;     // KV heads per group (0: all heads of the layer in one group)
  KvDtype dtype = KvDtype::kF16;
  std::vector<int64_t> window;  // [n_layer] sliding window of each layer (0: global); empty: all global
  // [n_layer] bytes of one token's stored K/V-projection input (KVPR; model::kv_input_row_bytes);
  // empty when the model did not say (representation kvpr then refuses to build).
  std::vector<uint64_t> act_row_bytes;

  uint32_t n_layer() const { return static_cast<uint32_t>(n_head_kv.size()); }
  // Heads per group of `layer` (group_heads clipped to the layer's heads; must divide them).
  uint32_t heads_per_group(uint32_t layer) const;
  uint32_t n_groups(uint32_t layer) const { return n_head_kv[layer] / heads_per_group(layer); }
  uint64_t block_bytes(uint32_t layer) const;
  int64_t window_of(uint32_t layer) const { return window.empty() ? 0 : window[layer]; }
  // The most query heads one KV head serves in any layer (n_head / n_head_kv); throws
  // Error(kInvalidArgument) when a layer's KV heads do not divide n_head.
  uint32_t max_q_per_kv(uint32_t n_head) const;
  // The most KV heads of any layer.
  uint32_t max_head_kv() const;
  // Scratch cpu::attend needs for any layer of these rows with n_head query heads on `threads` threads.
  uint64_t attention_scratch_bytes(uint32_t n_head, int threads) const;
  // Throws Error(kInvalidArgument) for an impossible geometry.
  void validate() const;
};

struct BlockKey {
  uint32_t layer = 0;
  uint32_t group = 0;
  uint32_t block = 0;  // token block: positions [block * block_tokens, (block + 1) * block_tokens)
};

}  // namespace kvtier::kv
