#include "model/hparams.h"

#include <limits>

#include "core/error.h"

namespace kvtier::model {
namespace {

uint32_t to_u32(const gguf::File& f, const std::string& key, int64_t v) {
  if (v < 0 || v > std::numeric_limits<uint32_t>::max()) {
    fail(ErrorKind::kInvalidFile, "{}: metadata '{}' = {} is out of range", f.path(), key, v);
  }
  return static_cast<uint32_t>(v);
}

uint32_t req_u32(const gguf::File& f, const std::string& key) {
  return to_u32(f, key, f.get_int(key));
}

std::optional<uint32_t> opt_u32(const gguf::File& f, const std::string& key) {
  auto v = f.opt_int(key);
  if (!v) return std::nullopt;
  return to_u32(f, key, *v);
}

}  // namespace

Arch arch_from_name(const std::string& name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "gemma3") return Arch::kGemma3;
  if (name == "opt") return Arch::kOpt;
  return Arch::kOther;
}

uint64_t Hparams::kv_bytes_per_token(uint32_t bytes_per_elem) const {
  uint64_t total = 0;
  for (uint32_t h : n_head_kv) total += uint64_t{h} * (head_dim_k + head_dim_v) * bytes_per_elem;
  return total;
}

bool Hparams::uniform_kv_heads() const {
  for (uint32_t h : n_head_kv) {
    if (h != n_head_kv.front()) return false;
  }
  return true;
}

Hparams read_hparams(const gguf::File& f) {
  Hparams hp;
  hp.arch_name = f.get_string("general.architecture");
  hp.arch = arch_from_name(hp.arch_name);
  const std::string p = hp.arch_name + ".";
  hp.n_layer = req_u32(f, p + "block_count");
  hp.n_embd = req_u32(f, p + "embedding_length");
  hp.n_ff = opt_u32(f, p + "feed_forward_length").value_or(0);
  hp.n_head = req_u32(f, p + "attention.head_count");
  if (hp.n_layer == 0 || hp.n_embd == 0 || hp.n_head == 0) {
    fail(ErrorKind::kInvalidFile, "{}: block_count, embedding_length and head_count must be non-zero",
         f.path());
  }

  const std::string kv_key = p + "attention.head_count_kv";
  if (const gguf::Value* v = f.find(kv_key); v != nullptr && v->as_array() != nullptr) {
    const auto& a = *v->as_array();
    if (a.size() != hp.n_layer) {
      fail(ErrorKind::kInvalidFile, "{}: '{}' has {} entries for {} layers", f.path(), kv_key, a.size(),
           hp.n_layer);
    }
    for (size_t i = 0; i < a.size(); ++i) {
      auto x = a.get_int(i);
      if (!x) fail(ErrorKind::kInvalidFile, "{}: '{}' must hold integers", f.path(), kv_key);
      hp.n_head_kv.push_back(to_u32(f, kv_key, *x));
    }
  } else {
    hp.n_head_kv.assign(hp.n_layer, opt_u32(f, kv_key).value_or(hp.n_head));
  }
  for (uint32_t h : hp.n_head_kv) {
    if (h > hp.n_head || (h != 0 && hp.n_head % h != 0)) {
      fail(ErrorKind::kInvalidFile, "{}: {} KV heads do not divide {} query heads", f.path(), h, hp.n_head);
    }
  }

  hp.head_dim_k = opt_u32(f, p + "attention.key_length").value_or(hp.n_embd / hp.n_head);
  hp.head_dim_v = opt_u32(f, p + "attention.value_length").value_or(hp.head_dim_k);
  hp.n_ctx_train = opt_u32(f, p + "context_length").value_or(0);
  hp.rope_freq_base = f.opt_float(p + "rope.freq_base");
  hp.rope_dim = opt_u32(f, p + "rope.dimension_count");
  hp.rms_eps = f.opt_float(p + "attention.layer_norm_rms_epsilon");
  hp.norm_eps = f.opt_float(p + "attention.layer_norm_epsilon");
  hp.sliding_window = opt_u32(f, p + "attention.sliding_window");
  hp.rope_scaling_type = f.opt_string(p + "rope.scaling.type");
  hp.rope_scaling_factor = f.opt_float(p + "rope.scaling.factor");
  hp.rope_freq_base_swa = f.opt_float(p + "rope.freq_base_swa");
  if (const gguf::Value* v = f.find(p + "attention.sliding_window_pattern"); v != nullptr && !v->as_array()) {
    hp.sliding_window_pattern = opt_u32(f, p + "attention.sliding_window_pattern");
  }
  hp.attn_logit_softcap = f.opt_float(p + "attn_logit_softcapping");
  hp.final_logit_softcap = f.opt_float(p + "final_logit_softcapping");

  if (auto n = opt_u32(f, p + "vocab_size")) {
    hp.n_vocab = *n;
  } else if (const gguf::Value* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->as_array()) {
    hp.n_vocab = static_cast<uint32_t>(tokens->as_array()->size());
  } else if (const auto* emb = f.find_tensor("token_embd.weight"); emb && emb->ne.size() == 2) {
    hp.n_vocab = static_cast<uint32_t>(emb->ne[1]);
  }
  return hp;
}

}  // namespace kvtier::model
