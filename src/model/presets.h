// Shapes of known models, for synthetic (random-weight) models used in tests and at-scale
// measurements. Speed does not depend on weight values, so these stand in for the real models.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kvtier::model {

struct Preset {
  std::string_view name;
  std::string_view arch;  // GGUF architecture name
  std::string_view description;
  uint32_t n_layer;
  uint32_t n_embd;
  uint32_t n_head;
  uint32_t n_head_kv;
  uint32_t head_dim;
  uint32_t n_ff;
  uint32_t n_vocab;
  uint32_t n_ctx;
  float rope_freq_base;
  float rms_eps;
  bool tied_embeddings;  // output projection shares token_embd
  bool qkv_bias;         // Qwen2-style biases on Q, K, V
};

std::span<const Preset> all_presets();
std::optional<Preset> find_preset(std::string_view name);

}  // namespace kvtier::model
