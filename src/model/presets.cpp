#include "model/presets.h"

namespace kvtier::model {
namespace {

// name, arch, description, layers, embd, heads, kv heads, head dim, ffn, vocab, ctx, rope base, eps, tied,
// bias
constexpr Preset kPresets[] = {
    {"tiny-llama", "llama", "2-layer GQA toy (4 q / 2 kv heads), a few MB", 2, 64, 4, 2, 16, 128, 272, 4096,
     10000.0f, 1e-5f, false, false},
    {"tiny-mha", "llama", "2-layer MHA toy (4 q / 4 kv heads), a few MB", 2, 64, 4, 4, 16, 128, 272, 4096,
     10000.0f, 1e-5f, false, false},
    {"smollm2-135m", "llama", "SmolLM2-135M shape (GQA 9/3)", 30, 576, 9, 3, 64, 1536, 49152, 8192, 100000.0f,
     1e-5f, true, false},
    {"llama3-8b", "llama", "Llama-3-8B shape (GQA 32/8)", 32, 4096, 32, 8, 128, 14336, 128256, 8192,
     500000.0f, 1e-5f, false, false},
    {"llama2-7b", "llama", "Llama-2-7B shape (MHA 32/32)", 32, 4096, 32, 32, 128, 11008, 32000, 4096,
     10000.0f, 1e-5f, false, false},
    {"qwen2-7b", "qwen2", "Qwen2-7B shape (GQA 28/4, QKV biases)", 28, 3584, 28, 4, 128, 18944, 152064, 32768,
     1000000.0f, 1e-6f, false, true},
    {"mistral-7b", "llama", "Mistral-7B-v0.2 shape (GQA 32/8)", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
     1000000.0f, 1e-5f, false, false},
    // OPT (LayerNorm with biases, learned positions, ReLU FFN, MHA, tied embeddings): the KVPR paper's
    // models. rope_freq_base is unused; rms_eps is the LayerNorm epsilon; ctx = the learned positions.
    {"tiny-opt", "opt", "2-layer OPT toy (MHA 4/4), a few MB", 2, 64, 4, 4, 16, 128, 272, 2048, 10000.0f,
     1e-5f, true, true},
    {"opt-125m", "opt", "OPT-125M shape (MHA 12/12)", 12, 768, 12, 12, 64, 3072, 50272, 2048, 10000.0f, 1e-5f,
     true, true},
    {"opt-1.3b", "opt", "OPT-1.3B shape (MHA 32/32)", 24, 2048, 32, 32, 64, 8192, 50272, 2048, 10000.0f,
     1e-5f, true, true},
    {"opt-6.7b", "opt", "OPT-6.7B shape (MHA 32/32)", 32, 4096, 32, 32, 128, 16384, 50272, 2048, 10000.0f,
     1e-5f, true, true},
    {"opt-13b", "opt", "OPT-13B shape (MHA 40/40)", 40, 5120, 40, 40, 128, 20480, 50272, 2048, 10000.0f,
     1e-5f, true, true},
};

}  // namespace

std::span<const Preset> all_presets() {
  return kPresets;
}

std::optional<Preset> find_preset(std::string_view name) {
  for (const auto& p : kPresets) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

}  // namespace kvtier::model
