// How well InfiniGen's speculation finds the attention that matters, measured on recorded rows of a
// real model (spec infinigen.md §6.3, §13): for layers >= 2, the held-out sample's first half is the
// "prompt" (its rows choose the partial columns, kv::PartialKeys), then every later position is a
// decode step: its partial query against the partial keys of the positions before it,
// policy::speculate with alpha and the cap, and the exact softmax over all keys to see how much of
// the attention mass the chosen rows plus the current token carry.
//
// The partial query is either InfiniGen's look-ahead (lookahead = true: layer l's query projection of
// layer l-1's input, RoPE'd at the step's position, times B; the samples must carry q_ahead) or layer
// l's own query (an upper bound on the look-ahead's quality: the selection rule's own loss).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "policy/infinigen_select.h"
#include "runtime/skew_sample.h"

namespace kvtier::runtime {

struct LayerSpeculation {
  uint32_t layer = 0;
  double fetched = 0.0;  // mean over steps of rows chosen / rows available
  double n_sel = 0.0;    // mean rows chosen per KV head and step
  double recall = 0.0;   // mean over steps and query heads of the softmax mass of the attended rows
  double min_recall = 1.0;
};

// Layers 2 .. L-1 that speculate at run time (sliding-window layers stay dense). Needs at least 8
// held-out tokens.
std::vector<LayerSpeculation> check_speculation(const model::ModelConfig& cfg, const skew::SkewSet& set,
                                                const std::vector<LayerSamples>& held_out,
                                                const policy::InfinigenParams& params, bool lookahead);

}  // namespace kvtier::runtime
