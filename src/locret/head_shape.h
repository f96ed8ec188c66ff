// Shapes of Locret's retaining heads (spec locret.md §3.1): one small FFN per layer over the layer's
// pre-RoPE q, k, v of a token,
//
//   X_t = [q head 0 | ... | q head h-1 | k head 0 | ... | k head h_kv-1 | v head 0 | ...]   (d_in)
//   S_t = act(X_t W1) W2                                                                  (h_kv)
//
// with W1 [d_in x d_m], W2 [d_m x h_kv], no biases, act the backbone's own activation (not gated).
// Stored in torch Linear layout (fc1: [d_m rows of d_in], fc2: [h_kv rows of d_m]), which is also
// the layout cpu::matmul takes: a row per output.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace kvtier::locret {

enum class HeadActivation { kSilu, kGeluTanh, kRelu };

const char* activation_name(HeadActivation a);
// silu | gelu_tanh | relu. Throws Error(kInvalidFile) for an unknown name.
HeadActivation activation_from_name(const char* name);

struct LayerShape {
  int64_t n_head = 0;      // query heads h
  int64_t n_head_kv = 0;   // KV heads h_kv (outputs of the head)
  int64_t head_dim_k = 0;  // d of q and k
  int64_t head_dim_v = 0;  // d of v

  int64_t q_dim() const { return n_head * head_dim_k; }
  int64_t k_dim() const { return n_head_kv * head_dim_k; }
  int64_t v_dim() const { return n_head_kv * head_dim_v; }
  int64_t d_in() const { return q_dim() + k_dim() + v_dim(); }
  bool operator==(const LayerShape&) const = default;
};

struct HeadShapes {
  int64_t d_m = 0;  // intermediate size
  HeadActivation act = HeadActivation::kSilu;
  std::vector<LayerShape> layers;

  uint32_t n_layer() const { return static_cast<uint32_t>(layers.size()); }
  // fc1 + fc2 elements of layer l, and of all layers.
  uint64_t parameters(uint32_t l) const;
  uint64_t parameters() const;
  bool operator==(const HeadShapes&) const = default;
};

// The heads' shapes for a model: one layer shape per model layer, act = the model's FFN activation.
HeadShapes head_shapes(const model::ModelConfig& cfg, int64_t d_m);
// The same for a hypothetical uniform model (parameter-count checks of the paper's configs).
HeadShapes head_shapes(uint32_t n_layer, int64_t n_head, int64_t n_head_kv, int64_t head_dim, int64_t d_m,
                       HeadActivation act = HeadActivation::kSilu);

}  // namespace kvtier::locret
