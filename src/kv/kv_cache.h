// The interface between the model and a KV policy. The model runs one forward pass at a time through
// an explicit protocol:
//
//   PassPositions p = kv.begin_pass({seq, n});     // the RoPE position of each new token
//   for each layer l (in order):
//     kv.write(l, rows);                            // the pass's new K and V (after RoPE) [+ extras]
//     kv.attend(l, q, n_head, la, o);               // attention of the pass's queries
//   kv.end_pass();                                  // the sequence now holds the new tokens
//
// and may abort_pass() instead of end_pass() when a layer failed (nothing of the pass is kept).
// A pass may carry several sequences (batching): begin_batch({{s0, n0}, {s1, n1}, ...}) gives each
// its positions; the rows and queries of write/attend are then the sequences' rows concatenated in
// batch order (sequence b's rows start at row n0 + ... + n(b-1)), and each sequence attends its own
// keys only. begin_pass(info) is the batch of one. A sequence appears at most once in a batch.
// Positions come from the cache, so a policy may keep compact positions after eviction; slots (where
// rows are stored) are the cache's business and never equal positions by assumption. Several
// sequences share one cache (its pools); each has its own positions and blocks. Misuse of the
// protocol (a write outside a pass, layers out of order, end_pass before every layer attended, ...)
// throws Error(kInternal) with a precise message, never undefined behaviour.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "kv/geometry.h"

namespace kvtier::kv {

class KvCompute;
using SeqId = uint32_t;

// Per-layer attention settings the model decides.
struct LayerAttention {
  float scale = 1.0f;    // multiplies q.k
  float softcap = 0.0f;  // > 0: tanh soft-capping of the scores
  int64_t window = 0;    // > 0: sliding window (key visible iff q_pos - k_pos < window)
};

struct PassInfo {
  SeqId seq = 0;
  int64_t n = 0;                    // new tokens of the sequence in the pass
  std::span<const int32_t> tokens;  // [n] their token ids (the model's forward gives them; a cache that
                                    // keeps spans whole needs them, the others ignore them)
};

// The positions of a pass's new tokens: token t is at position pos0 + t.
struct PassPositions {
  int64_t pos0 = 0;
  int64_t n = 0;
  int64_t position(int64_t t) const { return pos0 + t; }
};

// Extra rows a policy asks the model to hand over with each write (bits of KvCache::needs()). The
// model produces them only when asked; its buffers for them are sized up front.
enum KvNeed : uint32_t {
  kNeedNone = 0,
  kNeedLayerInput = 1u << 0,  // x: the normed input of the K/V projections (recompute from it)
  kNeedPreRope = 1u << 1,     // q_pre, k_pre: q and k before RoPE (after bias and QK-norm)
};

// One layer's new rows of a pass (n = the pass's token count, all sequences of a batch together):
struct LayerRows {
  const float* k = nullptr;      // [n, n_head_kv(layer), head_dim_k] f32, after RoPE
  const float* v = nullptr;      // [n, n_head_kv(layer), head_dim_v] f32
  const float* x = nullptr;      // kNeedLayerInput: [n, n_embd] f32, else null
  const float* q_pre = nullptr;  // kNeedPreRope: [n, n_head, head_dim_k] f32, else null
  const float* k_pre = nullptr;  // kNeedPreRope: [n, n_head_kv(layer), head_dim_k] f32, else null
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  virtual const KvGeometry& geometry() const = 0;
  // Positions one sequence can hold.
  virtual int64_t capacity() const = 0;
  // Sequences the cache holds (ids 0 .. max_sequences() - 1).
  virtual uint32_t max_sequences() const = 0;
  // Tokens the sequence has seen (its next token's position unless a policy compacts positions).
  virtual int64_t positions(SeqId seq) const = 0;
  // The extra rows this policy wants with each write (KvNeed bits).
  virtual uint32_t needs() const { return kNeedNone; }

  // The model-side compute hook (kv_compute.h), for policies that recompute or re-rotate rows; the
  // model sets it before the first pass. Policies that need it say so through needs().
  virtual void set_compute(KvCompute* compute) { (void)compute; }

  // Starts a pass of the new tokens of one or more distinct sequences; returns each one's positions
  // (in batch order; valid until the pass ends). Throws Error(kBudget) when a sequence's context is
  // full (no pass is then open).
  virtual std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) = 0;
  // A pass of n new tokens of one sequence.
  PassPositions begin_pass(const PassInfo& info) { return begin_batch({&info, 1})[0]; }
  // The pass's new rows for `layer` (layers in order 0, 1, ...).
  virtual void write(uint32_t layer, const LayerRows& rows) = 0;
  // Causal attention of the pass's queries over the layer's keys (the new ones included; each
  // sequence's queries over its own keys):
  //   q: [n, n_head, head_dim_k] f32    o: [n, n_head, head_dim_v] f32
  virtual void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) = 0;
  // Ends the pass: each sequence holds its new tokens.
  virtual void end_pass() = 0;
  // Drops an open pass (after a failure): the sequences are as before begin_batch. No-op without one.
  virtual void abort_pass() = 0;

  // The passes (token counts, in order) in which to prefill the next n tokens of `seq`, given the
  // session's chunk. A policy with its own chunk schedule (locret) plans it here and remembers where
  // its evicting prefill ends. Default: chunks of `chunk`.
  virtual std::vector<int64_t> plan_prefill(SeqId seq, int64_t n, int64_t chunk) {
    (void)seq;
    std::vector<int64_t> out;
    for (int64_t i = 0; i < n; i += chunk) out.push_back(std::min(chunk, n - i));
    return out;
  }

  // Forgets the sequence's positions >= n (n <= positions(seq)); n = 0 frees the sequence. Not during
  // a pass. Throws Error(kInvalidArgument) when a retention policy already freed positions that the
  // shortened sequence would attend.
  virtual void truncate(SeqId seq, int64_t n) = 0;
};

}  // namespace kvtier::kv
