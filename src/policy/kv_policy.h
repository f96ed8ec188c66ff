// A KV policy is a combination of independent axes, not a class:
//   Placement (where blocks live and how they reach compute) x Representation (how a row is stored)
//   x Selection (which stored tokens a step attends) x Retention (which tokens are ever forgotten).
// Paper names are presets of this product. Every valid combination runs through the same executor;
// a spec that names two values of one axis, or a value that does not exist, is a clear error.
//
// Spec grammar (the --kv-policy flag): a preset name, or values joined by '+', each naming its axis by
// itself ("headinfer+sliding", "layer+f32", "resident+sliding+f16"). Axes a spec leaves out take the
// defaults the caller passes (e.g. the representation of --kv-type).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "policy/kv_pool.h"
#include "policy/placement.h"

namespace kvtier::policy {

enum class Axis { kPlacement, kRepresentation, kSelection, kRetention };

enum class Representation {
  kF16,     // IEEE half rows
  kF32,     // 32-bit float rows
  kKivi4,   // KIVI-style 4-bit: keys per channel in token groups, values per token, recent rows full
  kKivi2,   // the same at 2 bits
  kKvpr,    // KVPR: the K/V-projection inputs of a prefix of positions (--recompute), K/V of the rest
            // (f16); the prefix's K/V are recomputed on each visit (exact; offloaded placements)
  kHybrid,  // HybridServe: each block of context is an activation checkpoint (its K/V-projection inputs
            // are loaded and its K/V recomputed) or a KV block, by Eq. 11 with the ratio --act-ratio
            // (exact; offloaded placements; kvpr's stored inputs and recompute path)
  // KIVI with kvpr's stored inputs ("kivi4+kvpr" in a spec: the two values compose): the home keeps
  // kivi4's (kivi2's) quantised pages and f16 residual rows and each position's inputs; a visit
  // recomputes the K/V of a prefix of whole key groups from the inputs and quantises them as the home
  // copy was, so it attends the same bits as kivi4 (kivi2) alone (approximate as KIVI is; offloaded)
  kKivi4Kvpr,
  kKivi2Kvpr,
};

// Representations whose home tier stores each position's K/V-projection inputs (kvpr, hybrid, kivi+kvpr).
inline bool stores_inputs(Representation r) {
  return r == Representation::kKvpr || r == Representation::kHybrid || r == Representation::kKivi4Kvpr ||
         r == Representation::kKivi2Kvpr;
}
// KIVI rows (kivi4, kivi2, alone or with kvpr's stored inputs).
inline bool is_kivi(Representation r) {
  return r == Representation::kKivi4 || r == Representation::kKivi2 || r == Representation::kKivi4Kvpr ||
         r == Representation::kKivi2Kvpr;
}
// Bits of a KIVI representation (4 or 2), 0 for the others.
inline int kivi_bits(Representation r) {
  if (r == Representation::kKivi4 || r == Representation::kKivi4Kvpr) return 4;
  if (r == Representation::kKivi2 || r == Representation::kKivi2Kvpr) return 2;
  return 0;
}
// A prefix of positions recomputed from stored inputs (kvpr, kivi+kvpr; not hybrid's ACT blocks):
// --recompute applies.
inline bool recomputes_prefix(Representation r) {
  return r == Representation::kKvpr || r == Representation::kKivi4Kvpr || r == Representation::kKivi2Kvpr;
}

enum class Selection {
  kAll,        // every stored token (sliding windows are applied by the attention mask)
  kQuest,      // Quest: per-page key bounds, each head attends its top pages within --kv-budget
  kInfinigen,  // InfiniGen: rows speculated one layer ahead from skewed partial q/k (offloaded placements)
};

enum class Retention {
  kNone,       // keep every position until truncation
  kSliding,    // free blocks that a sliding-window layer can no longer see (exact)
  kStreaming,  // StreamingLLM: attention sinks + a recent window, the rest freed
  kH2o,        // H2O: recent tokens + heavy hitters by accumulated attention, within --kv-budget
  kLocret,     // Locret: chunked prefill evicting to --kv-budget by trained retaining heads' scores
  kPool,       // InfiniGen's bounded pool: --kv-pool-limit bytes of K/V rows, a new token takes a victim's
               // slot (--kv-pool-eviction); selection infinigen, host or disk home
};

// Tuning of the approximate values (each field names the flag that sets it). Exact values ignore
// them; check_knobs() says which a policy needs and rejects values that cannot work.
// InfiniGen with grouped-query attention (spec infinigen.md §15.11): how the G query heads of a KV head
// turn into one score per row. kMax: S_g[t] = max_j S_j[t], the spec's rule; kRelative: S_g[t] =
// max_j (S_j[t] - max_t' S_j[t']), each head measured from its own maximum, so the threshold keeps a row
// when some head would give it more than e^-alpha of that head's top weight (the paper's per-head rule,
// applied per query head; one head per group gives the same rows as kMax).
enum class InfinigenGroup { kMax, kRelative };
std::string_view infinigen_group_name(InfinigenGroup g);
InfinigenGroup parse_infinigen_group(std::string_view name);  // Error(kInvalidArgument) naming the choices

// Locret renumbers the retained keys compactly after an eviction (spec locret.md §8.1), so a kept key
// that moves from row r to row w is rotated anew. kPreRope: from a copy of the key before RoPE kept
// beside every row (the spec's reference cache: K after RoPE, K before RoPE and V per row); kRerotate:
// the key after RoPE is turned by the angle of w - r (RoPE composes; spec §3.5 "an equivalent
// alternative, exact up to rounding"), so no copy is kept: a third less memory per row with f16 KV,
// at one more rounding of the key per move.
enum class LocretKeys { kPreRope, kRerotate };
std::string_view locret_keys_name(LocretKeys k);
LocretKeys parse_locret_keys(std::string_view name);  // Error(kInvalidArgument) naming the choices

// The positions of locret's kept rows (spec locret.md §8.1). kCompact (the default, the reference's):
// row i of a (layer, KV head) sits at position i after every eviction, new tokens continue from the
// rows held, and moved keys are turned to their new rows (LocretKeys). kOriginal (the spec's
// documented deviation, for experiments): every row keeps the true position its key was rotated at,
// new tokens take their true positions, and nothing is re-rotated or copied before RoPE; attention is
// then the full model's restricted to the kept rows, and positions grow with the context.
enum class LocretPositions { kCompact, kOriginal };
std::string_view locret_positions_name(LocretPositions p);
LocretPositions parse_locret_positions(std::string_view name);  // Error(kInvalidArgument) naming the choices

// What locret keeps on a layer with a sliding window of its own (Gemma-3's local layers; the paper's
// models have none). kRecent: its most recent rows, as the window itself does and as h2o and
// streaming keep such layers; the kept rows are then contiguous, so their relative positions are the
// true ones. kScored: the retaining heads' best rows, as on a global layer; the window then applies
// over compact positions and the layer sees far tokens the model never shows it.
enum class LocretSliding { kRecent, kScored };
std::string_view locret_sliding_name(LocretSliding s);
LocretSliding parse_locret_sliding(std::string_view name);  // Error(kInvalidArgument) naming the choices

// The spans locret keeps or evicts whole (the tokenizer splits a number into digits and a long word
// into pieces, each scored alone). kToken: every token by its own score (the paper). kWord: the tokens
// of one word (a run of letters, digits or other non-ASCII bytes with no space or punctuation between
// them) rank by the best score among them. kNumber: the same for runs of digits only.
enum class LocretSpan { kToken, kWord, kNumber };
std::string_view locret_span_name(LocretSpan s);
LocretSpan parse_locret_span(std::string_view name);  // Error(kInvalidArgument) naming the choices

struct PolicyKnobs {
  int64_t budget = 0;           // --kv-budget: tokens per (sequence, layer) kept (h2o) or attended
                                // (quest); 0 = not given
  int64_t sinks = 4;            // --sinks: streaming's attention-sink tokens (the first ones)
  int64_t window = 0;           // --window: streaming's recent tokens (0: --kv-budget - --sinks)
  double h2o_recent = 0.5;      // --h2o-recent: share of the h2o budget kept for the recent tokens
  int64_t quest_page = 16;      // --quest-page: tokens per Quest page
  int64_t kivi_group = 32;      // --kivi-group: tokens per key-quantisation group (per channel)
  int64_t kivi_residual = 128;  // --kivi-residual: recent tokens kept in full precision
  // --recompute: kvpr's prefix of recomputed positions (kRecomputeAuto: the scheduler's split;
  // kRecomputeRandom: a pseudo-random split per visit, for tests; N >= 0: min(N, positions))
  static constexpr int64_t kRecomputeAuto = -1;
  static constexpr int64_t kRecomputeRandom = -2;
  int64_t recompute = kRecomputeAuto;
  // --act-ratio: hybrid's ACT:KV block ratio R (kActRatioAuto: Algorithm 1 from the profiled rates;
  // R >= 0 forced; +inf: every block ACT)
  static constexpr double kActRatioAuto = -1;
  double act_ratio = kActRatioAuto;
  double infinigen_alpha =
      5.0;  // --infinigen-alpha: threshold margin (scaled logits; the paper's Llama value)
  double infinigen_budget = 0.2;  // --infinigen-budget: cap on the rows fetched per KV head, share of T
  InfinigenGroup infinigen_group = InfinigenGroup::kRelative;  // --infinigen-group
  int64_t stabilizers = -1;  // --stabilizers: locret's n_s, the last units protected after a non-final
                             // prefill chunk (-1: --kv-budget / 4)
  int64_t local_tail = 100;  // --local-tail: locret's n_loc, the prompt's last tokens never evicted
  int64_t locret_pool = 1;   // --locret-pool: locret ranks a unit by the best score within this many
                             // neighbouring units (odd; 1: its own score, the paper)
  int64_t locret_sinks = 0;  // --locret-sinks: locret never evicts the prompt's first this many tokens
                             // (an instruction, a system prompt; 0: none, the paper)
  LocretKeys locret_keys = LocretKeys::kPreRope;                 // --locret-keys
  LocretPositions locret_positions = LocretPositions::kCompact;  // --locret-positions
  LocretSliding locret_sliding = LocretSliding::kRecent;         // --locret-sliding
  LocretSpan locret_span = LocretSpan::kToken;                   // --locret-span
  uint64_t pool_limit = 0;  // --kv-pool-limit: bytes of the pool's K/V rows (retention pool; 0: no limit)
  PoolEviction pool_eviction = PoolEviction::kCounter;  // --kv-pool-eviction
  PoolPrefill pool_prefill = PoolPrefill::kOrder;       // --kv-pool-prefill
  bool operator==(const PolicyKnobs&) const = default;
};

struct KvPolicy {
  Placement placement = Placement::kResident;
  Representation representation = Representation::kF16;
  Selection selection = Selection::kAll;
  Retention retention = Retention::kNone;
  PolicyKnobs knobs;  // set from flags, not from the spec

  // Exact: same tokens and logits as `resident` (bit-identical on the CPU backend): a lossless
  // representation, every token selected, and nothing forgotten that a query could still see.
  bool exact() const;
  // The canonical spec: the placement, then every axis that differs from its default ("layer+sliding").
  std::string spec() const;
  bool operator==(const KvPolicy&) const = default;
};

std::string_view axis_name(Axis a);
// kivi4+kvpr: "kivi4+kvpr" (the spec's two values).
std::string_view representation_name(Representation r);
// Is `value` (an AxisValue name of the representation axis) one of the values r is made of? (kivi4+kvpr
// is made of kivi4 and kvpr; the others of their own name.)
bool representation_has(Representation r, std::string_view value);
std::string_view selection_name(Selection s);
std::string_view retention_name(Retention r);

// One value of one axis, as `kvtier policies` lists it.
struct AxisValue {
  Axis axis;
  std::string_view name;
  bool exact;              // does this value keep a policy exact?
  std::string_view help;   // what it does
  std::string_view flags;  // the flags that tune it, space-separated ("" if none)
};
std::span<const AxisValue> axis_values();
// How kivi4 / kivi2 compose with kvpr (a line for `kvtier policies`).
std::string_view representation_compose_note();

// A named combination (the papers' names and the baselines).
struct Preset {
  std::string_view name;
  std::string_view spec;  // the combination it stands for
  std::string_view help;
};
std::span<const Preset> presets();

// Parses a spec; throws Error(kInvalidArgument) naming the unknown value (with the known ones), or the
// two values that compete for one axis. The one pair of values of one axis that composes: kivi4 or kivi2
// with kvpr (representation kivi4+kvpr, kivi2+kvpr).
KvPolicy parse_kv_policy(std::string_view spec, const KvPolicy& defaults = {});
// "resident,layer+sliding" -> policies in order; an empty item or a repeated policy is an error.
std::vector<KvPolicy> parse_kv_policy_list(std::string_view list, const KvPolicy& defaults = {});
// Checks the knobs the policy's values use: a budget where one is needed (h2o, quest; streaming
// needs --window or --kv-budget), sizes that cannot work. Throws Error(kInvalidArgument) naming the
// flag. Knobs of values the policy does not use are ignored.
void check_knobs(const KvPolicy& p);
// --locret-sinks >= 0, and with the stabilizers below --kv-budget (LocretKv and TieredKv check it too).
void check_locret_sinks(const PolicyKnobs& k);
// Tokens of streaming's recent window under these knobs (--window, else --kv-budget - --sinks).
int64_t streaming_window(const PolicyKnobs& k);
// Locret's stabilizer length n_s under these knobs (--stabilizers, else --kv-budget / 4).
int64_t locret_stabilizers(const PolicyKnobs& k);

// Does the spec name a value of this axis itself (rather than leaving it to the defaults)?
bool spec_names_axis(std::string_view spec, Axis axis);

}  // namespace kvtier::policy
