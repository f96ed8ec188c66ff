#include "locret/match_fixture.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "gguf/reader.h"
#include "locret/retaining_head.h"
#include "model/synthetic.h"

namespace kvtier::locret {
namespace {

constexpr model::Preset kMatchPreset = {"locret-match",
                                        "llama",
                                        "Locret match-head fixture (spec §7 C1)",
                                        4,
                                        128,
                                        4,
                                        2,
                                        32,
                                        256,
                                        kMatchVocab,
                                        4096,
                                        1000000.0f,
                                        1e-5f,
                                        false,
                                        false};

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Rng {
  uint64_t s;
  uint64_t next() { return s = mix64(s); }
  int64_t uniform(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
};

float* tensor_f32(std::vector<uint8_t>& bytes, const gguf::Content& c, const std::string& name) {
  for (const auto& t : c.tensors) {
    if (t.name == name) {
      KVTIER_ASSERT(t.type == GgmlType::kF32);
      return reinterpret_cast<float*>(bytes.data() + (t.data - bytes.data()));
    }
  }
  KVTIER_ASSERT(false, "fixture tensor {} missing", name);
  return nullptr;
}

}  // namespace

void write_match_model(const std::string& path, const MatchModelOptions& o) {
  const model::Preset& p = kMatchPreset;
  KVTIER_ASSERT(o.match_heads <= p.n_head_kv);
  model::SynthOptions so;
  so.type = GgmlType::kF32;
  so.seed = o.seed;
  gguf::Writer w = model::synth_writer(p, so);
  w.set("general.name", gguf::Value::string("locret match-head fixture"));
  w.set("kvtier.locret_fixture.match_heads", gguf::Value::u32(o.match_heads));
  w.set("kvtier.locret_fixture.logit_gain", gguf::Value::f32(o.logit_gain));
  w.set("kvtier.locret_fixture.branch_gain", gguf::Value::f32(o.branch_gain));
  std::vector<uint8_t> bytes = w.to_bytes();
  const gguf::Content c = gguf::parse(bytes, path);
  const int64_t E = p.n_embd, dk = p.head_dim, g = p.n_head / p.n_head_kv;
  // Needle-class tokens share one embedding direction (each token embedding has std 1 per element).
  float* embd = tensor_f32(bytes, c, "token_embd.weight");  // [n_vocab rows, E]
  std::vector<float> shared(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    shared[static_cast<size_t>(e)] = static_cast<float>(gaussian(o.seed, 0x5eed, static_cast<uint64_t>(e)));
  for (int64_t t = kMatchNeedleFirst; t < kMatchVocab; ++t) {
    for (int64_t e = 0; e < E; ++e) embd[t * E + e] += o.needle_shared * shared[static_cast<size_t>(e)];
  }
  for (uint32_t l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    float* wq = tensor_f32(bytes, c, b + "attn_q.weight");  // [n_head * dk rows, E]
    float* wk = tensor_f32(bytes, c, b + "attn_k.weight");  // [n_head_kv * dk rows, E]
    for (uint32_t j = 0; j < o.match_heads; ++j) {
      // Only the slowly rotating dimensions: a token matches its copies at any distance.
      std::fill(wk + j * dk * E, wk + (j * dk + o.first_match_dim) * E, 0.0f);
      for (int64_t i = j * g; i < (j + 1) * g; ++i) {
        for (int64_t e = 0; e < dk * E; ++e) wq[i * dk * E + e] = o.logit_gain * wk[j * dk * E + e];
      }
    }
    for (const char* name : {"attn_output.weight", "ffn_down.weight"}) {
      float* m = tensor_f32(bytes, c, b + name);
      const int64_t count = name[0] == 'a' ? p.n_head * dk * E : int64_t{p.n_ff} * E;
      for (int64_t e = 0; e < count; ++e) m[e] *= o.branch_gain;
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) fail(ErrorKind::kIo, "cannot write {}", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(ErrorKind::kIo, "cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
}

std::vector<Sample> match_samples(int64_t count, const MatchSampleOptions& o, uint64_t seed) {
  KVTIER_ASSERT(o.needle_min >= 1 && o.needle_min <= o.needle_max && o.min_len >= o.needle_max + 3 &&
                o.min_len <= o.max_len);
  std::vector<Sample> out;
  Rng rng{mix64(seed ^ 0x6c6f63726574ull)};
  for (int64_t s = 0; s < count; ++s) {
    const int64_t len = rng.uniform(o.min_len, o.max_len);
    const int64_t needle = rng.uniform(o.needle_min, o.needle_max);
    const int64_t hay = len - 2 - needle;  // <bos> and the marker
    const int64_t at = rng.uniform(0, hay);
    std::vector<int32_t> span(static_cast<size_t>(needle));
    for (auto& t : span) t = static_cast<int32_t>(rng.uniform(kMatchNeedleFirst, kMatchVocab - 1));
    Sample x;
    x.tokens.push_back(kMatchBos);
    for (int64_t i = 0; i < hay; ++i) {
      if (i == at) x.tokens.insert(x.tokens.end(), span.begin(), span.end());
      x.tokens.push_back(static_cast<int32_t>(rng.uniform(0, 255)));
    }
    if (at == hay) x.tokens.insert(x.tokens.end(), span.begin(), span.end());
    x.tokens.push_back(kMatchMarker);
    x.n_prompt = static_cast<int64_t>(x.tokens.size());
    KVTIER_ASSERT(x.n_prompt == len);
    x.tokens.insert(x.tokens.end(), span.begin(), span.end());
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace kvtier::locret
