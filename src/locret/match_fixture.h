// The match-head synthetic backbone and its data (spec locret.md §7 C1): a deterministic tiny
// decoder whose important tokens are known, for training and checking retaining heads on the CPU
// without downloads.
//
// Model: Llama architecture, L 4, d_model 128, 4 query / 2 KV heads (GQA), head dim 32, RoPE base
// 1e6, vocabulary 512, f32 random weights (model/synthetic). In every layer the first
// `match_heads` KV heads are "match heads": the W_Q rows of every query head of the group are
// `logit_gain` times that KV head's W_K rows, so q.k is large exactly where a key's token equals the
// query's token (attention peaked and content-dependent); their fast-rotating RoPE dimensions are
// zeroed, so a copy matches at any distance in the context. Attention outputs and FFN outputs are
// scaled by `branch_gain` so the residual stream stays close to the token embedding and later
// layers match tokens too.
//
// The needle-class tokens' embeddings share one direction (see MatchModelOptions::needle_shared).
//
// Samples: <bos>, a haystack of random byte tokens [0, 256), a needle span of 8-16 tokens drawn
// from [259, 512) at a random depth, the question marker 258, then the answer = the needle tokens
// (teacher-forced). The answer's match heads attend the needle, so its tokens carry the labels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "locret/trainer.h"

namespace kvtier::locret {

struct MatchModelOptions {
  uint64_t seed = 1;
  uint32_t match_heads = 1;  // per layer, KV heads 0 .. match_heads - 1
  float logit_gain = 4.0f;   // W_Q = gain * W_K on match groups: random-pair logit std about 3
  // Match heads use only dimensions >= this of q and k (RoPE pairs (2i, 2i + 1) with angle
  // base^(-2i / 32) position: from pair 7 on they turn less than about 1 rad over 1000 positions).
  int64_t first_match_dim = 14;
  float branch_gain = 0.25f;
  // Needle-class tokens [259, 512) share an embedding direction of this gain (relative to the
  // random part): the class is visible in a token's own q, k, v, which is what a retaining head
  // must learn to read, and answer tokens match every needle token.
  float needle_shared = 1.0f;
};

// Writes the fixture model to path (atomically); returns nothing, load it with runtime::load_model
// or gguf::File + model::load_weights.
void write_match_model(const std::string& path, const MatchModelOptions& options = {});

struct MatchSampleOptions {
  int64_t min_len = 512;  // prompt tokens, <bos> and marker included
  int64_t max_len = 2048;
  int64_t needle_min = 8;
  int64_t needle_max = 16;
};

constexpr int32_t kMatchBos = 256;
constexpr int32_t kMatchMarker = 258;
constexpr int32_t kMatchNeedleFirst = 259;
constexpr int32_t kMatchVocab = 512;

// `count` samples, a pure function of (options, seed).
std::vector<Sample> match_samples(int64_t count, const MatchSampleOptions& options, uint64_t seed);

}  // namespace kvtier::locret
