#include "model/synthetic.h"

#include <cmath>

#include "core/error.h"
#include "core/quantize_ref.h"

namespace kvtier::model {
namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// GGML file types (llama_ftype) for general.file_type.
uint32_t file_type_of(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    s += static_cast<char>(0xe0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

constexpr int kTokenNormal = 1;
constexpr int kTokenControl = 3;
constexpr int kTokenUnused = 5;

}  // namespace

std::vector<std::string> synth_vocab(uint32_t n_vocab) {
  KVTIER_ASSERT(n_vocab >= 258, "vocabulary of {} tokens is too small", n_vocab);
  std::vector<std::string> v;
  v.reserve(n_vocab);
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    std::string s;
    append_utf8(s, printable ? b : next_extra++);
    v.push_back(std::move(s));
  }
  v.emplace_back("<|begin_of_text|>");
  v.emplace_back("<|end_of_text|>");
  for (uint32_t i = 258; i < n_vocab; ++i) v.push_back("<|reserved_" + std::to_string(i - 258) + "|>");
  return v;
}

namespace {

// OPT: pre-LN blocks with biases everywhere, learned positions, an ungated ReLU FFN.
std::vector<SynthTensor> opt_tensors(const Preset& p, const SynthOptions& o) {
  const uint32_t n_layer = o.n_layer ? o.n_layer : p.n_layer;
  const uint32_t n_ctx = o.n_ctx ? o.n_ctx : p.n_ctx;
  const uint64_t d = uint64_t{p.n_head} * p.head_dim;
  auto w = [&](uint64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  const float b = 0.02f;
  std::vector<SynthTensor> t;
  t.push_back({"token_embd.weight", {p.n_embd, p.n_vocab}, o.type, SynthInit::kUniform, 1.0f});
  t.push_back({"position_embd.weight", {p.n_embd, n_ctx}, o.type, SynthInit::kUniform, 0.1f});
  for (uint32_t l = 0; l < n_layer; ++l) {
    const std::string s = "blk." + std::to_string(l) + ".";
    t.push_back({s + "attn_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
    t.push_back({s + "attn_norm.bias", {p.n_embd}, GgmlType::kF32, SynthInit::kUniform, b});
    for (const char* m : {"attn_q", "attn_k", "attn_v"}) {
      t.push_back({s + m + ".weight", {p.n_embd, d}, o.type, SynthInit::kUniform, w(p.n_embd)});
      t.push_back({s + m + ".bias", {d}, GgmlType::kF32, SynthInit::kUniform, b});
    }
    t.push_back({s + "attn_output.weight", {d, p.n_embd}, o.type, SynthInit::kUniform, w(d)});
    t.push_back({s + "attn_output.bias", {p.n_embd}, GgmlType::kF32, SynthInit::kUniform, b});
    t.push_back({s + "ffn_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
    t.push_back({s + "ffn_norm.bias", {p.n_embd}, GgmlType::kF32, SynthInit::kUniform, b});
    t.push_back({s + "ffn_up.weight", {p.n_embd, p.n_ff}, o.type, SynthInit::kUniform, w(p.n_embd)});
    t.push_back({s + "ffn_up.bias", {p.n_ff}, GgmlType::kF32, SynthInit::kUniform, b});
    t.push_back({s + "ffn_down.weight", {p.n_ff, p.n_embd}, o.type, SynthInit::kUniform, w(p.n_ff)});
    t.push_back({s + "ffn_down.bias", {p.n_embd}, GgmlType::kF32, SynthInit::kUniform, b});
  }
  t.push_back({"output_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
  t.push_back({"output_norm.bias", {p.n_embd}, GgmlType::kF32, SynthInit::kUniform, b});
  return t;  // the output projection is tied to token_embd
}

bool is_opt(const Preset& p) {
  return p.arch == "opt";
}

}  // namespace

std::vector<SynthTensor> synth_tensors(const Preset& p, const SynthOptions& o) {
  if (is_opt(p)) return opt_tensors(p, o);
  const uint32_t n_layer = o.n_layer ? o.n_layer : p.n_layer;
  const uint64_t q_dim = uint64_t{p.n_head} * p.head_dim;
  const uint64_t kv_dim = uint64_t{p.n_head_kv} * p.head_dim;
  const float embd_scale = 1.0f;
  auto w = [&](uint64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  std::vector<SynthTensor> t;
  t.push_back({"token_embd.weight", {p.n_embd, p.n_vocab}, o.type, SynthInit::kUniform, embd_scale});
  for (uint32_t l = 0; l < n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
    t.push_back({b + "attn_q.weight", {p.n_embd, q_dim}, o.type, SynthInit::kUniform, w(p.n_embd)});
    t.push_back({b + "attn_k.weight", {p.n_embd, kv_dim}, o.type, SynthInit::kUniform, w(p.n_embd)});
    t.push_back({b + "attn_v.weight", {p.n_embd, kv_dim}, o.type, SynthInit::kUniform, w(p.n_embd)});
    if (p.qkv_bias) {
      t.push_back({b + "attn_q.bias", {q_dim}, GgmlType::kF32, SynthInit::kUniform, 0.02f});
      t.push_back({b + "attn_k.bias", {kv_dim}, GgmlType::kF32, SynthInit::kUniform, 0.02f});
      t.push_back({b + "attn_v.bias", {kv_dim}, GgmlType::kF32, SynthInit::kUniform, 0.02f});
    }
    t.push_back({b + "attn_output.weight", {q_dim, p.n_embd}, o.type, SynthInit::kUniform, w(q_dim)});
    t.push_back({b + "ffn_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
    t.push_back({b + "ffn_gate.weight", {p.n_embd, p.n_ff}, o.type, SynthInit::kUniform, w(p.n_embd)});
    t.push_back({b + "ffn_up.weight", {p.n_embd, p.n_ff}, o.type, SynthInit::kUniform, w(p.n_embd)});
    t.push_back({b + "ffn_down.weight", {p.n_ff, p.n_embd}, o.type, SynthInit::kUniform, w(p.n_ff)});
  }
  t.push_back({"output_norm.weight", {p.n_embd}, GgmlType::kF32, SynthInit::kOnes, 1.0f});
  if (!p.tied_embeddings) {
    t.push_back({"output.weight", {p.n_embd, p.n_vocab}, o.type, SynthInit::kUniform, w(p.n_embd)});
  }
  return t;
}

uint64_t parameter_count(const Preset& preset) {
  uint64_t n = 0;
  for (const auto& t : synth_tensors(preset, {})) {
    uint64_t e = 1;
    for (auto d : t.ne) e *= d;
    n += e;
  }
  return n;
}

void synth_values(const SynthTensor& t, uint64_t seed, uint64_t first, std::span<float> out) {
  if (t.init == SynthInit::kOnes) {
    for (float& x : out) x = 1.0f;
    return;
  }
  const uint64_t key = mix64(seed ^ fnv1a(t.name));
  const float a = t.scale * std::sqrt(3.0f);  // uniform(-a, a) has standard deviation `scale`
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t r = mix64(key + (first + i) * 0x9e3779b97f4a7c15ULL);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    out[i] = (2.0f * u - 1.0f) * a;
  }
}

gguf::Writer synth_writer(const Preset& p, const SynthOptions& o) {
  if (!can_quantize_ref(o.type)) {
    fail(ErrorKind::kInvalidArgument,
         "synthetic models can be written as f32, f16, bf16, q8_0, q4_0 or q4_1, not {}",
         ggml_type_name(o.type));
  }
  const uint32_t n_layer = o.n_layer ? o.n_layer : p.n_layer;
  const uint32_t n_ctx = o.n_ctx ? o.n_ctx : p.n_ctx;
  using gguf::Value;
  gguf::Writer w;
  const std::string a(p.arch);
  w.set("general.architecture", Value::string(a));
  w.set("general.name", Value::string("synthetic " + std::string(p.name)));
  w.set("general.file_type", Value::u32(file_type_of(o.type)));
  w.set("general.alignment", Value::u32(32));
  w.set("kvtier.synthetic.preset", Value::string(std::string(p.name)));
  w.set("kvtier.synthetic.seed", Value::u64(o.seed));
  w.set(a + ".context_length", Value::u32(n_ctx));
  w.set(a + ".embedding_length", Value::u32(p.n_embd));
  w.set(a + ".block_count", Value::u32(n_layer));
  w.set(a + ".feed_forward_length", Value::u32(p.n_ff));
  w.set(a + ".attention.head_count", Value::u32(p.n_head));
  w.set(a + ".attention.head_count_kv", Value::u32(p.n_head_kv));
  w.set(a + ".attention.key_length", Value::u32(p.head_dim));
  w.set(a + ".attention.value_length", Value::u32(p.head_dim));
  if (is_opt(p)) {  // LayerNorm, learned positions (context_length of them), no RoPE
    w.set(a + ".attention.layer_norm_epsilon", Value::f32(p.rms_eps));
  } else {
    w.set(a + ".attention.layer_norm_rms_epsilon", Value::f32(p.rms_eps));
    w.set(a + ".rope.freq_base", Value::f32(p.rope_freq_base));
    w.set(a + ".rope.dimension_count", Value::u32(p.head_dim));
  }
  w.set(a + ".vocab_size", Value::u32(p.n_vocab));

  std::vector<int32_t> types(p.n_vocab, kTokenUnused);
  for (uint32_t i = 0; i < 256; ++i) types[i] = kTokenNormal;
  types[256] = kTokenControl;
  types[257] = kTokenControl;
  w.set("tokenizer.ggml.model", Value::string("gpt2"));
  w.set("tokenizer.ggml.pre", Value::string("gpt-2"));
  w.set("tokenizer.ggml.tokens", Value::string_array(synth_vocab(p.n_vocab)));
  w.set("tokenizer.ggml.token_type", Value::i32_array(types));
  w.set("tokenizer.ggml.merges", Value::string_array({}));
  w.set("tokenizer.ggml.bos_token_id", Value::u32(256));
  w.set("tokenizer.ggml.eos_token_id", Value::u32(257));
  w.set("tokenizer.ggml.add_bos_token", Value::boolean(true));

  const uint64_t seed = o.seed;
  for (auto& t : synth_tensors(p, o)) {
    auto spec = std::make_shared<SynthTensor>(t);
    w.add_tensor(t.name, t.type, t.ne, [spec, seed](std::span<uint8_t> dst) {
      const uint64_t row = spec->ne[0];
      const uint64_t rows = spec->ne.size() > 1 ? spec->ne[1] : 1;
      const uint64_t row_bytes = *ggml_row_bytes(spec->type, row);
      std::vector<float> buf(row);
      for (uint64_t r = 0; r < rows; ++r) {
        synth_values(*spec, seed, r * row, buf);
        quantize_row_ref(spec->type, buf, dst.subspan(r * row_bytes, row_bytes));
      }
    });
  }
  return w;
}

}  // namespace kvtier::model
