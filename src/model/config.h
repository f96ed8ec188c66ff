// What the forward pass needs to know about an architecture, derived once from the hparams:
// per-model switches (RoPE pairing, activation, norms, scalings) and per-layer attention settings.
// Supported: llama (Llama-2/3, SmolLM2, Mistral), qwen2, gemma3, opt. Anything else is an error naming it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/float_ops.h"
#include "model/hparams.h"

namespace kvtier::model {

enum class FfnActivation {
  kSilu,      // SwiGLU: silu(gate) * up
  kGeluTanh,  // GeGLU: gelu_tanh(gate) * up
  kRelu,      // OPT: relu(up + b_up), no gate
};

enum class NormKind {
  kRms,    // RMSNorm with a weight
  kLayer,  // LayerNorm with a weight and a bias (OPT)
};

struct LayerConfig {
  uint32_t n_head_kv = 0;
  bool sliding = false;  // a sliding-window layer (window > 0)
  int64_t window = 0;
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;  // position multiplier (linear scaling: 1 / factor)
  int rope_table = 0;       // index of the (base, scale) pair in ModelConfig::rope_tables
};

struct RopeTableConfig {
  float base = 10000.0f;
  float scale = 1.0f;
  bool use_freq_factors = false;  // Llama-3 rope_freqs (global layers)
};

struct ModelConfig {
  Arch arch = Arch::kOther;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_head = 0;
  uint32_t head_dim_k = 0;
  uint32_t head_dim_v = 0;
  uint32_t n_ff = 0;
  uint32_t n_vocab = 0;
  uint32_t n_rot = 0;
  uint32_t n_ctx_train = 0;
  float rms_eps = 1e-5f;  // epsilon of every norm (RMSNorm or LayerNorm)
  NormKind norm = NormKind::kRms;
  cpu::RopeMode rope_mode = cpu::RopeMode::kNormal;
  FfnActivation act = FfnActivation::kSilu;
  float embd_scale = 1.0f;                   // Gemma: sqrt(n_embd)
  float attn_scale = 1.0f;                   // multiplies q.k
  float attn_softcap = 0.0f;                 // 0: none
  float final_softcap = 0.0f;                // 0: none
  bool qk_norm = false;                      // Gemma-3: RMSNorm of each q and k head
  bool post_norms = false;                   // Gemma-3: norms after attention and after the FFN
  bool qkv_bias = false;                     // Qwen2, OPT (also taken when a llama file has the tensors)
  bool learned_pos = false;                  // OPT: position embeddings added to the token embeddings
                                             // (n_rot = 0: no RoPE)
  bool out_ffn_bias = false;                 // OPT: biases on attn_output, ffn_up and ffn_down
  std::vector<RopeTableConfig> rope_tables;  // distinct RoPE settings (1 or 2)
  std::vector<LayerConfig> layers;

  uint32_t max_head_kv() const;
};

// Throws Error(kUnsupported) naming an architecture without a forward pass, or an unsupported
// option (e.g. YaRN RoPE scaling).
ModelConfig make_config(const Hparams& hp);

}  // namespace kvtier::model
