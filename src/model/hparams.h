// Model hyper-parameters read from GGUF metadata ("<arch>.*" keys). Immutable once loaded; runtime
// options (context actually used, chunk size, ...) live elsewhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/reader.h"

namespace kvtier::model {

// Architectures the engine knows by name. Whether the forward pass supports one is decided where
// the model is built; inspecting a file works for any architecture.
enum class Arch { kLlama, kQwen2, kGemma3, kOpt, kOther };

Arch arch_from_name(const std::string& name);

struct Hparams {
  std::string arch_name;  // general.architecture
  Arch arch = Arch::kOther;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_ff = 0;
  uint32_t n_head = 0;
  std::vector<uint32_t> n_head_kv;  // [n_layer]: GGUF allows a per-layer array
  uint32_t head_dim_k = 0;          // <arch>.attention.key_length, default n_embd / n_head
  uint32_t head_dim_v = 0;          // <arch>.attention.value_length, default head_dim_k
  uint32_t n_ctx_train = 0;
  uint32_t n_vocab = 0;
  std::optional<double> rope_freq_base;
  std::optional<uint32_t> rope_dim;
  std::optional<double> rms_eps;
  std::optional<double> norm_eps;  // "<arch>.attention.layer_norm_epsilon" (LayerNorm models: OPT)
  std::optional<uint32_t> sliding_window;
  // RoPE scaling ("<arch>.rope.scaling.type" / ".factor") and the base of sliding-window layers.
  std::optional<std::string> rope_scaling_type;  // "none", "linear", "yarn", ...
  std::optional<double> rope_scaling_factor;
  std::optional<double> rope_freq_base_swa;
  std::optional<uint32_t> sliding_window_pattern;  // every n-th layer is global (Gemma-3: 6)
  std::optional<double> attn_logit_softcap;        // "<arch>.attn_logit_softcapping"
  std::optional<double> final_logit_softcap;       // "<arch>.final_logit_softcapping"

  // Bytes of K and V for one token over all layers, at `bytes_per_elem` bytes per element.
  uint64_t kv_bytes_per_token(uint32_t bytes_per_elem = 2) const;
  // True when every layer has the same number of KV heads; then n_head_kv[0] is that number.
  bool uniform_kv_heads() const;
};

// Reads the hyper-parameters; throws Error(kInvalidFile) naming the missing or bad key.
Hparams read_hparams(const gguf::File& file);

}  // namespace kvtier::model
