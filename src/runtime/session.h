// Sequences being evaluated: the forward pass, one KV cache (any policy) whose pools the sequences
// share, the memory ledger and the logits buffer. Chunked prefill, single-token decode, and
// whole-text evaluation (every position's logits) for perplexity and logit dumps. Each call runs one
// sequence (id 0 unless given); sequences may be interleaved freely, each sees only its own KV.
// step() runs several sequences in one pass (batching): prefill chunks and decode tokens mixed, each
// sequence getting the same logits as alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"
#include "kv/infinigen_emulation.h"
#include "kv/kv_cache.h"
#include "kv/ledger.h"
#include "kv/tiered_kv.h"
#include "model/forward.h"
#include "runtime/model_files.h"

namespace kvtier::runtime {

using model::TokenId;

struct SessionOptions {
  int64_t n_ctx = 0;    // positions the KV cache holds (0: the model's training context)
  int64_t chunk = 512;  // prefill chunk (tokens per forward pass)
  int threads = 1;
  uint32_t kv_block_tokens = 256;
  cpu::KvDtype kv_dtype = cpu::KvDtype::kF16;
  std::optional<cpu::Isa> isa;  // default: the best the CPU has
  // KV placement (resident, layer, headinfer), retention, sequences, compute-local budget, home tier.
  kv::KvOptions kv_placement;
  uint64_t host_mem = 0;  // budget of the host tier (offloaded KV in DRAM); 0 = unlimited
  // kvpr --recompute auto: the file of cached KVPR profiles (runtime/profile_cache.h) the split-point
  // scheduler's rates come from (measured and stored on first use); empty: measured each time.
  std::string profile_cache;
  // Weight placement (--weights-mem, --weights-from): resident layers under a budget, the others
  // streamed from host memory or the GGUF file (model/weight_stream.h).
  model::WeightStreamOptions weights;
  // selection infinigen: the skew file (empty: the model's path with .skew.gguf), read unless
  // kv_placement.skew holds it already (runtime/skew_sample.h, load_infinigen_skew).
  std::string skew_path;
  // InfiniGen's teacher-forced emulation (--infinigen-emulate; kv/infinigen_emulation.h): the selection
  // infinigen of kv_placement applied to every query at a position >= infinigen_emulate_from over a
  // resident cache, instead of an offloaded placement's decode steps. One sequence, no pool.
  bool infinigen_emulation = false;
  // Positions below this attend densely, as a prompt, and choose the speculation's columns (each
  // sequence its own, as the decode path chooses them from its prefill); 0: every query emulated, with
  // the skew file's offline columns. Must be below n_ctx.
  int64_t infinigen_emulate_from = 0;
};

// Called after each prefill chunk: (tokens done, tokens total).
using ProgressFn = std::function<void(int64_t, int64_t)>;
// Called with the logits of each evaluated position: (position, [n_vocab] f32).
using LogitsFn = std::function<void(int64_t, std::span<const float>)>;
// Called with the output-normed hidden state of each position: (position, [n_embd] f32).
using StatesFn = std::function<void(int64_t, std::span<const float>)>;

class Session {
 public:
  Session(const LoadedModel& model, const SessionOptions& opt);

  // Appends tokens to sequence `seq` through chunked prefill; returns the logits after the last one
  // ([n_vocab]; valid until the next call).
  std::span<const float> prefill(kv::SeqId seq, std::span<const TokenId> tokens,
                                 const ProgressFn& progress = {});
  std::span<const float> prefill(std::span<const TokenId> tokens, const ProgressFn& progress = {}) {
    return prefill(0, tokens, progress);
  }
  // Appends one token; returns its logits.
  std::span<const float> decode(kv::SeqId seq, TokenId token);
  std::span<const float> decode(TokenId token) { return decode(0, token); }
  // One forward pass over the tokens of several distinct sequences (at most chunk() tokens and
  // max_batch() parts in all; rows kLast or kNone each). Returns the logits of the parts that asked
  // for them, in order ([parts with kLast, n_vocab] f32; valid until the next call).
  std::span<const float> step(std::span<const model::SeqTokens> parts);
  // Parts one step() may carry.
  int64_t max_batch() const { return std::min<int64_t>(logit_rows_, kv().max_sequences()); }
  // Appends tokens, calling `fn` with every position's logits (for perplexity / dumps), in passes of
  // at most min(chunk, 64 MiB of logits) tokens (results do not depend on the pass size).
  // Returns the logits of the last position.
  std::span<const float> evaluate(kv::SeqId seq, std::span<const TokenId> tokens, const LogitsFn& fn,
                                  const ProgressFn& progress = {});
  std::span<const float> evaluate(std::span<const TokenId> tokens, const LogitsFn& fn,
                                  const ProgressFn& progress = {}) {
    return evaluate(0, tokens, fn, progress);
  }
  // Appends tokens in the passes prefill() runs, calling `fn` with every position's output-normed
  // hidden state (the output projection's input: equal states give equal logits, so this checks
  // every position bit for bit at the cost of a prefill). Returns the logits of the last position,
  // the same bits prefill() returns.
  std::span<const float> evaluate_states(kv::SeqId seq, std::span<const TokenId> tokens, const StatesFn& fn,
                                         const ProgressFn& progress = {});
  // The passes (token counts) in which prefill() would append the next n tokens of `seq`, in passes of
  // at most `chunk` tokens (0: the session's chunk). A policy with its own schedule (locret evicts
  // after each planned piece) plans it here.
  std::vector<int64_t> plan_prefill(kv::SeqId seq, int64_t n, int64_t chunk = 0) {
    return kv().plan_prefill(seq, n, chunk > 0 ? std::min(chunk, opt_.chunk) : opt_.chunk);
  }
  // Whether where a prompt's passes end can change the result: not for an exact policy (bit-identical
  // to resident at any cut); for an approximate one it can (h2o evicts and kivi quantises at the end of
  // each pass, locret after each pass of its plan). Batched callers (bench --batch, serve) then feed a
  // prompt in exactly the pieces plan_prefill gives, so it gets what those passes give alone, whatever
  // else shares them; otherwise they may cut it to fill each pass.
  bool prefill_cuts_matter() const;
  // Forgets the sequence's positions >= n (n = 0 frees it).
  void truncate(kv::SeqId seq, int64_t n);
  void truncate(int64_t n) { truncate(0, n); }

  int64_t n_past(kv::SeqId seq = 0) const { return kv().positions(seq); }
  uint32_t max_sequences() const { return kv().max_sequences(); }
  int64_t n_ctx() const { return kv().capacity(); }
  int64_t chunk() const { return opt_.chunk; }
  const kv::MemoryLedger& ledger() const { return ledger_; }
  const LoadedModel& model() const { return model_; }
  cpu::Isa isa() const { return isa_; }
  // The cache the passes run through (the emulation's, under --infinigen-emulate).
  kv::KvCache& kv() { return emulation_ ? static_cast<kv::KvCache&>(*emulation_) : *kv_; }
  const kv::KvCache& kv() const { return emulation_ ? static_cast<const kv::KvCache&>(*emulation_) : *kv_; }
  // The teacher-forced emulation's figures (SessionOptions::infinigen_emulation), else nullopt.
  std::optional<kv::InfinigenEmulationStats> emulation_stats() const {
    return emulation_ ? std::optional(emulation_->stats()) : std::nullopt;
  }
  // Transfer statistics of an offloaded placement (nullopt for resident).
  std::optional<kv::TieredStats> kv_stats() const;
  // Weight placement and streaming counters.
  model::WeightStreamStats weight_stats() const { return weights_->stats(); }

 private:
  const LoadedModel& model_;
  SessionOptions opt_;
  cpu::Isa isa_;
  kv::MemoryLedger ledger_;
  std::unique_ptr<model::WeightStreamer> weights_;
  ThreadPool pool_;
  std::unique_ptr<kv::KvCache> kv_;  // the placement's cache (the emulation's inner one under it)
  std::unique_ptr<kv::InfinigenEmulationKv> emulation_;
  std::unique_ptr<model::Forward> forward_;
  kv::Reservation logits_reservation_;
  int64_t logit_rows_ = 1;  // tokens per pass of evaluate() (its logits buffer's rows)
  // [logit_rows_, n_vocab] f32, left uninitialised: its pages become resident only as passes write
  // rows (decode writes one; evaluate() and batches write more), not all at construction.
  std::unique_ptr<float[]> logits_;
};

// The options as a Session applies them: context from the model when 0, chunk clipped to it; throws
// Error(kInvalidArgument) for impossible values.
SessionOptions resolve_session_options(const model::ModelConfig& cfg, SessionOptions opt);

// The KV geometry a Session with these options builds its cache with (the model's, and the size of
// each layer's stored K/V-projection inputs).
kv::KvGeometry kv_geometry(const LoadedModel& model, const SessionOptions& opt);

// The bytes a Session with these options reserves, per tier and category, computed without
// allocating from the same size functions its parts allocate with (model::forward_buffers,
// kv::kv_footprint, the logits rows): a prediction equal to the session's ledger by construction
// (the Session asserts it). Throws what the Session would (bad options, a --kv-mem that cannot fit).
kv::MemoryLedger predict_memory(const LoadedModel& model, const SessionOptions& opt);

// Default prefill chunk for a model: keeps the per-chunk activations and all-position logits near
// 64 MiB, between 16 and 512 tokens.
int64_t default_chunk(const model::ModelConfig& cfg);

}  // namespace kvtier::runtime
