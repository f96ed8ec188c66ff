#include "model/config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvtier::model {
namespace {

int table_for(ModelConfig& c, const RopeTableConfig& t) {
  for (size_t i = 0; i < c.rope_tables.size(); ++i) {
    const auto& o = c.rope_tables[i];
    if (o.base == t.base && o.scale == t.scale && o.use_freq_factors == t.use_freq_factors)
      return static_cast<int>(i);
  }
  c.rope_tables.push_back(t);
  return static_cast<int>(c.rope_tables.size() - 1);
}

float linear_rope_scale(const Hparams& hp) {
  const std::string type = hp.rope_scaling_type.value_or("none");
  if (type == "none" || type.empty()) return 1.0f;
  if (type == "linear") {
    const double f = hp.rope_scaling_factor.value_or(1.0);
    if (!(f > 0.0)) fail(ErrorKind::kInvalidFile, "rope scaling factor {} must be positive", f);
    return static_cast<float>(1.0 / f);
  }
  fail(ErrorKind::kUnsupported, "RoPE scaling type '{}' of architecture '{}' is not supported", type,
       hp.arch_name);
}

}  // namespace

uint32_t ModelConfig::max_head_kv() const {
  uint32_t m = 0;
  for (const auto& l : layers) m = std::max(m, l.n_head_kv);
  return m;
}

ModelConfig make_config(const Hparams& hp) {
  if (hp.arch != Arch::kLlama && hp.arch != Arch::kQwen2 && hp.arch != Arch::kGemma3 &&
      hp.arch != Arch::kOpt) {
    fail(ErrorKind::kUnsupported, "architecture '{}' is not supported (supported: llama, qwen2, gemma3, opt)",
         hp.arch_name);
  }
  ModelConfig c;
  c.arch = hp.arch;
  c.n_layer = hp.n_layer;
  c.n_embd = hp.n_embd;
  c.n_head = hp.n_head;
  c.head_dim_k = hp.head_dim_k;
  c.head_dim_v = hp.head_dim_v;
  c.n_ff = hp.n_ff;
  c.n_vocab = hp.n_vocab;
  c.n_rot = hp.arch == Arch::kOpt ? 0 : hp.rope_dim.value_or(hp.head_dim_k);
  c.n_ctx_train = hp.n_ctx_train;
  c.rms_eps =
      static_cast<float>(hp.arch == Arch::kOpt ? hp.norm_eps.value_or(1e-5)
                                               : hp.rms_eps.value_or(hp.arch == Arch::kGemma3 ? 1e-6 : 1e-5));
  if (c.n_ff == 0) fail(ErrorKind::kInvalidFile, "'{}.feed_forward_length' is missing or 0", hp.arch_name);
  if (c.n_vocab == 0) fail(ErrorKind::kInvalidFile, "the vocabulary size is unknown");
  if (hp.arch == Arch::kOpt) {
    if (hp.rope_dim.value_or(0) != 0)
      fail(ErrorKind::kInvalidFile, "an OPT model has learned positions, not RoPE");
    if (c.n_ctx_train == 0)
      fail(ErrorKind::kInvalidFile, "'opt.context_length' (the learned positions) is missing");
  } else if (c.n_rot == 0 || c.n_rot % 2 != 0 || c.n_rot > c.head_dim_k) {
    fail(ErrorKind::kInvalidFile, "RoPE dimension {} for head dimension {}", c.n_rot, c.head_dim_k);
  }
  if (!hp.uniform_kv_heads() && hp.arch != Arch::kGemma3 && hp.arch != Arch::kLlama) {
    fail(ErrorKind::kUnsupported, "per-layer KV head counts in '{}'", hp.arch_name);
  }
  const float base = static_cast<float>(hp.rope_freq_base.value_or(10000.0));
  const float scale = linear_rope_scale(hp);
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim_k));
  c.attn_softcap = static_cast<float>(hp.attn_logit_softcap.value_or(0.0));
  c.final_softcap = static_cast<float>(hp.final_logit_softcap.value_or(0.0));
  c.layers.resize(c.n_layer);

  switch (hp.arch) {
    case Arch::kLlama:
    case Arch::kQwen2: {
      c.rope_mode = hp.arch == Arch::kLlama ? cpu::RopeMode::kNormal : cpu::RopeMode::kNeox;
      c.qkv_bias = hp.arch == Arch::kQwen2;
      const int t = table_for(c, {base, scale, hp.arch == Arch::kLlama});
      const int64_t window = hp.sliding_window.value_or(0);  // Mistral, if the file sets it
      for (uint32_t l = 0; l < c.n_layer; ++l) {
        c.layers[l] = {hp.n_head_kv[l], window > 0, window, base, scale, t};
      }
      break;
    }
    case Arch::kGemma3: {
      c.rope_mode = cpu::RopeMode::kNeox;
      c.act = FfnActivation::kGeluTanh;
      c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
      c.qk_norm = true;
      c.post_norms = true;
      const uint32_t pattern = hp.sliding_window_pattern.value_or(6);
      const int64_t window = hp.sliding_window.value_or(0);
      const float base_swa = static_cast<float>(hp.rope_freq_base_swa.value_or(10000.0));
      const int t_global = table_for(c, {base, scale, false});
      const int t_local = table_for(c, {base_swa, 1.0f, false});
      for (uint32_t l = 0; l < c.n_layer; ++l) {
        const bool sliding = window > 0 && pattern > 0 && (l + 1) % pattern != 0;
        c.layers[l] = sliding ? LayerConfig{hp.n_head_kv[l], true, window, base_swa, 1.0f, t_local}
                              : LayerConfig{hp.n_head_kv[l], false, 0, base, scale, t_global};
      }
      break;
    }
    case Arch::kOpt: {
      // Pre-LN decoder with biases everywhere, learned positions, ReLU FFN (HF OPTDecoderLayer with
      // do_layer_norm_before); one table entry keeps the per-layer indexing uniform (n_rot = 0).
      c.norm = NormKind::kLayer;
      c.act = FfnActivation::kRelu;
      c.qkv_bias = true;
      c.out_ffn_bias = true;
      c.learned_pos = true;
      const int t = table_for(c, {10000.0f, 1.0f, false});
      for (uint32_t l = 0; l < c.n_layer; ++l) c.layers[l] = {hp.n_head_kv[l], false, 0, 10000.0f, 1.0f, t};
      break;
    }
    case Arch::kOther:
      break;
  }
  return c;
}

}  // namespace kvtier::model
