// The toys of the Locret KV tests (test_locret_kv.cpp, test_locret_tiered.cpp): a 2-layer geometry of
// 2 KV heads and 4 query heads, a toy RoPE model hook and a context-free hash scorer.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/error.h"
#include "kv/kv_compute.h"
#include "kv/token_spans.h"
#include "kv/unit_scorer.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kDk = 16, kDv = 16;
constexpr uint32_t kHead = 4;  // 2 KV heads of 2 query heads each

// A RoPE of the toy model: pairs (i, i + d/2) rotated by pos * 100^(-2i/d).
void toy_rope(const float* in, int64_t pos, float* out) {
  for (int64_t i = 0; i < kDk / 2; ++i) {
    const double th = static_cast<double>(pos) * std::pow(100.0, -2.0 * static_cast<double>(i) / kDk);
    const auto c = static_cast<float>(std::cos(th)), s = static_cast<float>(std::sin(th));
    const float a = in[i], b = in[i + kDk / 2];
    out[i] = a * c - b * s;
    out[i + kDk / 2] = a * s + b * c;
  }
}

// One toy layer's new rows for a pass of n tokens at positions pos0.., drawn from nd(rng) in the order
// q_pre, k_pre, v, and the queries and keys after toy_rope:
//   q_pre, q: [n, kHead, kDk]    k_pre, k: [n, 2, kDk]    v: [n, 2, kDv]
struct ToyLayerRows {
  std::vector<float> q_pre, k_pre, v, q, k;
};
inline ToyLayerRows toy_layer_rows(int64_t n, int64_t pos0, std::mt19937& rng,
                                   std::normal_distribution<float>& nd) {
  ToyLayerRows r{std::vector<float>(n * kHead * kDk),
                 std::vector<float>(n * 2 * kDk),
                 std::vector<float>(n * 2 * kDv),
                 {},
                 {}};
  for (auto* x : {&r.q_pre, &r.k_pre, &r.v}) {
    for (float& e : *x) e = nd(rng);
  }
  r.q.resize(r.q_pre.size());
  r.k.resize(r.k_pre.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < kHead; ++h)
      toy_rope(&r.q_pre[(t * kHead + h) * kDk], pos0 + t, &r.q[(t * kHead + h) * kDk]);
    for (int64_t h = 0; h < 2; ++h) toy_rope(&r.k_pre[(t * 2 + h) * kDk], pos0 + t, &r.k[(t * 2 + h) * kDk]);
  }
  return r;
}

class ToyCompute final : public KvCompute {
 public:
  void project_kv(uint32_t, const float*, std::span<const int64_t>, float*, float*) override {
    fail(ErrorKind::kInternal, "not used");
  }
  void rope_q(uint32_t, const float*, int64_t, int64_t, float*) override {
    fail(ErrorKind::kInternal, "not used");
  }
  void rope_k_rows(uint32_t, const float* k_pre, std::span<const int64_t> positions, float* out) override {
    EXPECT_LE(static_cast<int64_t>(positions.size()), max_rows());
    for (size_t t = 0; t < positions.size(); ++t) toy_rope(k_pre + t * kDk, positions[t], out + t * kDk);
  }
  int64_t max_rows() const override { return 7; }  // forces batches of re-rotation
};

// score = a hash of (layer, head, position) in [0, 1), quantised to `levels` values (ties) if > 0;
// `rigged`: decreasing with the position (the most recent units score lowest).
class HashScorer final : public UnitScorer {
 public:
  explicit HashScorer(int levels = 0, bool rigged = false) : levels_(levels), rigged_(rigged) {}
  static float value(uint32_t l, int64_t h, int64_t pos, int levels, bool rigged) {
    if (rigged) return -static_cast<float>(pos);
    uint64_t x = (uint64_t{l} << 40) ^ (static_cast<uint64_t>(h) << 32) ^ static_cast<uint64_t>(pos);
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
    return levels > 0 ? std::floor(static_cast<float>(u) * levels) : static_cast<float>(u);
  }
  float value(uint32_t l, int64_t h, int64_t pos) const { return value(l, h, pos, levels_, rigged_); }
  void score(ThreadPool&, cpu::Isa, uint32_t layer, int64_t pos0, const float*, const float*, const float*,
             int64_t n, float* scores) override {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < 2; ++h) scores[t * 2 + h] = value(layer, h, pos0 + t);
    }
  }

 private:
  int levels_;
  bool rigged_;
};

// A toy vocabulary for --locret-span: its kv::TokenEdge bits by id, 0 " w" (a word after a space), 1 "7"
// (a digit), 2 "." (punctuation), 3 "ing" (a word's continuation).
inline std::vector<uint8_t> toy_token_edges() {
  return {kEndsInWord, kStartsInWord | kEndsInWord | kStartsInDigit | kEndsInDigit, kEdgeNone,
          kStartsInWord | kEndsInWord};
}
// At least n toy token ids: words of 1-3 pieces, numbers of 1-7 digits, full stops.
inline std::vector<int32_t> toy_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens;
  while (tokens.size() < n) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      for (int i = 1 + static_cast<int>(rng() % 7); i > 0; --i) tokens.push_back(1);
    } else if (kind == 1) {
      tokens.push_back(0);
      for (int i = static_cast<int>(rng() % 3); i > 0; --i) tokens.push_back(3);
    } else {
      tokens.push_back(kind == 2 ? 2 : 0);
    }
  }
  return tokens;
}

}  // namespace
}  // namespace kvtier::kv
