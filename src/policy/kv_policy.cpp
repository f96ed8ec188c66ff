#include "policy/kv_policy.h"

#include <optional>

#include "core/error.h"

namespace kvtier::policy {

std::string_view infinigen_group_name(InfinigenGroup g) {
  return g == InfinigenGroup::kMax ? "max" : "relative";
}

InfinigenGroup parse_infinigen_group(std::string_view name) {
  for (const InfinigenGroup g : {InfinigenGroup::kMax, InfinigenGroup::kRelative})
    if (infinigen_group_name(g) == name) return g;
  fail(ErrorKind::kInvalidArgument, "--infinigen-group {}: expected max or relative", name);
}

std::string_view locret_keys_name(LocretKeys k) {
  return k == LocretKeys::kRerotate ? "rerotate" : "prerope";
}

LocretKeys parse_locret_keys(std::string_view name) {
  for (const LocretKeys k : {LocretKeys::kPreRope, LocretKeys::kRerotate})
    if (locret_keys_name(k) == name) return k;
  fail(ErrorKind::kInvalidArgument, "--locret-keys {}: expected prerope or rerotate", name);
}

std::string_view locret_positions_name(LocretPositions p) {
  return p == LocretPositions::kOriginal ? "original" : "compact";
}

LocretPositions parse_locret_positions(std::string_view name) {
  for (const LocretPositions p : {LocretPositions::kCompact, LocretPositions::kOriginal})
    if (locret_positions_name(p) == name) return p;
  fail(ErrorKind::kInvalidArgument, "--locret-positions {}: expected compact or original", name);
}

std::string_view locret_sliding_name(LocretSliding s) {
  return s == LocretSliding::kScored ? "scored" : "recent";
}

LocretSliding parse_locret_sliding(std::string_view name) {
  for (const LocretSliding s : {LocretSliding::kRecent, LocretSliding::kScored})
    if (locret_sliding_name(s) == name) return s;
  fail(ErrorKind::kInvalidArgument, "--locret-sliding {}: expected recent or scored", name);
}

std::string_view locret_span_name(LocretSpan s) {
  switch (s) {
    case LocretSpan::kToken:
      return "token";
    case LocretSpan::kWord:
      return "word";
    case LocretSpan::kNumber:
      return "number";
  }
  return "token";
}

LocretSpan parse_locret_span(std::string_view name) {
  for (const LocretSpan s : {LocretSpan::kToken, LocretSpan::kWord, LocretSpan::kNumber})
    if (locret_span_name(s) == name) return s;
  fail(ErrorKind::kInvalidArgument, "--locret-span {}: expected token, word or number", name);
}

namespace {

constexpr AxisValue kValues[] = {
    {Axis::kPlacement, "resident", true, "all KV in compute-local memory", "--kv-mem"},
    {Axis::kPlacement, "layer", true,
     "whole layers' KV offloaded to host memory or --kv-disk, the next layer prefetched",
     "--kv-disk --host-mem --prefetch-depth"},
    {Axis::kPlacement, "headinfer", true, "groups of KV heads offloaded, ping-pong prefetch",
     "--group --static-heads --kv-disk --host-mem --prefetch-depth"},
    {Axis::kRepresentation, "f16", true, "rows stored as IEEE half floats (the default)", "--kv-type"},
    {Axis::kRepresentation, "f32", true, "rows stored as 32-bit floats", "--kv-type"},
    {Axis::kRepresentation, "kvpr", true,
     "KVPR: the home tier keeps each position's K/V-projection input (the quantised activation row the "
     "projection consumes) beside its f16 K/V; a visit loads the inputs of a prefix of positions and the "
     "K/V of the rest and recomputes the prefix's K/V (bit-identical); offloaded placements",
     "--recompute"},
    {Axis::kRepresentation, "hybrid", true,
     "HybridServe: each block of context is an activation checkpoint or a KV block, in the ratio "
     "--act-ratio (Eq. 11); a visit loads the checkpoints' K/V-projection inputs and the KV blocks' K/V, "
     "and recomputes the checkpoints' K/V (bit-identical; kvpr's stored inputs); offloaded placements",
     "--act-ratio"},
    {Axis::kRepresentation, "kivi4", false,
     "KIVI 4-bit: keys quantised per channel in groups of --kivi-group tokens, values per token; the "
     "last --kivi-residual tokens stay f16; dequantised tile by tile inside attention",
     "--kivi-group --kivi-residual"},
    {Axis::kRepresentation, "kivi2", false, "KIVI 2-bit: as kivi4 at 2 bits per element",
     "--kivi-group --kivi-residual"},
    // (kvpr composes with kivi4 and kivi2: see kComposeNote)
    {Axis::kSelection, "all", true, "attention sees every stored token (the default)", ""},
    {Axis::kSelection, "quest", false,
     "Quest: per page of --quest-page keys a per-channel min/max bound; each decode step attends, per KV "
     "head, the pages with the largest bound on q.k, --kv-budget positions in all (prefill stays dense); "
     "every placement (offloaded: the bounds stay compute-local and a step loads the selected pages only)",
     "--kv-budget --quest-page"},
    {Axis::kSelection, "infinigen", false,
     "InfiniGen: from layer l-1's input, layer l's partial query (SVD-skewed columns of the --skew file) "
     "scores partial keys; each decode step loads and attends, per KV head, the rows scoring above "
     "max - --infinigen-alpha, at most --infinigen-budget of them, plus the current token; layers 0-1, "
     "sliding-window layers and prefill stay dense; offloaded placements (layer, headinfer)",
     "--skew --infinigen-alpha --infinigen-budget"},
    {Axis::kRetention, "none", true, "every position is kept until the sequence is truncated (the default)",
     ""},
    {Axis::kRetention, "sliding", true,
     "sliding-window layers free the blocks no later query can see (Gemma-3's local layers); "
     "the memory is sized for window + chunk, not the context",
     ""},
    {Axis::kRetention, "streaming", false,
     "StreamingLLM: the first --sinks tokens and a recent --window are kept, the blocks between them freed "
     "on every tier; the sinks are attended at positions within the cache. Layers with a window of their "
     "own keep it (as sliding)",
     "--sinks --window --kv-budget"},
    {Axis::kRetention, "h2o", false,
     "H2O: each layer keeps --kv-budget rows per KV head, the recent ones (--h2o-recent of the budget) and "
     "the heavy hitters (most attention received so far), evicting after each pass; resident placement. "
     "Layers with a window of their own keep it",
     "--kv-budget --h2o-recent"},
    {Axis::kRetention, "locret", false,
     "Locret: prefill in chunks of --chunk; trained retaining heads (--locret-heads FILE) score every new "
     "KV unit once, and after each chunk each (layer, KV head) keeps the --kv-budget best-scored units, "
     "the last --stabilizers always among them (a layer with a sliding window of its own: its most recent, "
     "--locret-sliding); the prompt's last --local-tail tokens and decoded tokens "
     "are not evicted; positions are renumbered compactly; resident, layer or headinfer placement (host "
     "or --kv-disk home)",
     "--kv-budget --locret-heads --stabilizers --local-tail --locret-pool --locret-sinks --locret-keys "
     "--locret-sliding"},
    {Axis::kRetention, "pool", false,
     "InfiniGen's bounded KV pool: the layers that speculate hold at most --kv-pool-limit bytes of K/V rows "
     "(slots per layer, sequence and KV head); past that each new token takes a victim's slot, chosen by "
     "--kv-pool-eviction (counter: fewest fetches, fifo: oldest, lru: least recently fetched) among the "
     "older half; without --kv-pool-limit nothing is evicted; selection infinigen, host or --kv-disk home",
     "--kv-pool-limit --kv-pool-eviction --kv-pool-prefill"},
};

constexpr Preset kPresets[] = {
    {"resident", "resident", "the standard baseline: all KV in compute-local memory"},
    {"layer", "layer", "layer-wise offload (FlexGen / HF OffloadedCache)"},
    {"headinfer", "headinfer", "HeadInfer: head-wise offload with adaptive group size"},
    {"kvpr", "layer+kvpr", "KVPR: layer-wise offload with partial KV recomputation from stored inputs"},
    {"hybridserve", "layer+hybrid",
     "HybridServe: layer-wise offload of a hybrid cache of KV blocks and activation checkpoints "
     "(recomputed to KV); with --weights-mem, weights streamed too"},
    {"infinigen", "layer+infinigen",
     "InfiniGen: layer-wise offload loading only the rows speculated one layer ahead (approximate)"},
    {"locret", "resident+locret",
     "Locret: chunked prefill evicting to --kv-budget by trained retaining heads (--locret-heads)"},
};

// `kvtier policies` prints it under the representation axis.
constexpr std::string_view kComposeNote =
    "kivi4+kvpr, kivi2+kvpr: the one pair of representation values that composes. The home keeps KIVI's "
    "quantised pages and f16 residual rows and kvpr's inputs of every position; a visit recomputes the "
    "K/V of a prefix of whole --kivi-group key groups (--recompute, rounded down; auto weighs the "
    "quantised bytes it saves) and quantises them as the home copy was: the same bits as kivi4 (kivi2) "
    "alone; offloaded placements (layer+kivi4+kvpr, headinfer+kivi2+kvpr)";

std::optional<AxisValue> find_value(std::string_view name) {
  for (const AxisValue& v : kValues) {
    if (v.name == name) return v;
  }
  return std::nullopt;
}

std::string known_names() {
  std::string s = "presets:";
  for (const Preset& p : kPresets) s.append(" ").append(p.name);
  for (Axis a : {Axis::kPlacement, Axis::kRepresentation, Axis::kSelection, Axis::kRetention}) {
    s.append("; ").append(axis_name(a)).append(":");
    for (const AxisValue& v : kValues) {
      if (v.axis == a) s.append(" ").append(v.name);
    }
  }
  return s;
}

template <typename E>
E value_of(std::string_view name, std::initializer_list<E> all, std::string_view (*name_of)(E)) {
  for (E e : all) {
    if (name_of(e) == name) return e;
  }
  fail(ErrorKind::kInternal, "axis value '{}' has no enum", name);
}

// The parts of a spec: a preset expands to its own spec first.
std::vector<std::string_view> parts_of(std::string_view spec) {
  std::vector<std::string_view> out;
  if (spec.empty()) fail(ErrorKind::kInvalidArgument, "empty KV policy (known {})", known_names());
  while (true) {
    const size_t plus = spec.find('+');
    const std::string_view part = spec.substr(0, plus);
    if (part.empty()) fail(ErrorKind::kInvalidArgument, "KV policy '{}' has an empty part", spec);
    out.push_back(part);
    if (plus == std::string_view::npos) break;
    spec.remove_prefix(plus + 1);
  }
  return out;
}

}  // namespace

std::string_view axis_name(Axis a) {
  switch (a) {
    case Axis::kPlacement:
      return "placement";
    case Axis::kRepresentation:
      return "representation";
    case Axis::kSelection:
      return "selection";
    case Axis::kRetention:
      return "retention";
  }
  return "?";
}

std::string_view representation_name(Representation r) {
  switch (r) {
    case Representation::kF16:
      return "f16";
    case Representation::kF32:
      return "f32";
    case Representation::kKivi4:
      return "kivi4";
    case Representation::kKivi2:
      return "kivi2";
    case Representation::kKvpr:
      return "kvpr";
    case Representation::kHybrid:
      return "hybrid";
    case Representation::kKivi4Kvpr:
      return "kivi4+kvpr";
    case Representation::kKivi2Kvpr:
      return "kivi2+kvpr";
  }
  return "?";
}

bool representation_has(Representation r, std::string_view value) {
  if (r == Representation::kKivi4Kvpr) return value == "kivi4" || value == "kvpr";
  if (r == Representation::kKivi2Kvpr) return value == "kivi2" || value == "kvpr";
  return value == representation_name(r);
}

std::string_view representation_compose_note() {
  return kComposeNote;
}

std::string_view selection_name(Selection s) {
  switch (s) {
    case Selection::kAll:
      return "all";
    case Selection::kQuest:
      return "quest";
    case Selection::kInfinigen:
      return "infinigen";
  }
  return "?";
}

std::string_view retention_name(Retention r) {
  switch (r) {
    case Retention::kNone:
      return "none";
    case Retention::kSliding:
      return "sliding";
    case Retention::kStreaming:
      return "streaming";
    case Retention::kH2o:
      return "h2o";
    case Retention::kLocret:
      return "locret";
    case Retention::kPool:
      return "pool";
  }
  return "?";
}

int64_t streaming_window(const PolicyKnobs& k) {
  return k.window > 0 ? k.window : k.budget - k.sinks;
}

int64_t locret_stabilizers(const PolicyKnobs& k) {
  return k.stabilizers >= 0 ? k.stabilizers : k.budget / 4;
}

void check_locret_sinks(const PolicyKnobs& k) {
  if (k.locret_sinks < 0)
    fail(ErrorKind::kInvalidArgument, "--locret-sinks {}: must be >= 0", k.locret_sinks);
  if (k.locret_sinks > 0 && k.locret_sinks + locret_stabilizers(k) >= k.budget) {
    fail(
        ErrorKind::kInvalidArgument,
        "--locret-sinks {} and --stabilizers {} leave no room to choose in --kv-budget {}: their sum must be "
        "smaller",
        k.locret_sinks, locret_stabilizers(k), k.budget);
  }
}

void check_knobs(const KvPolicy& p) {
  const PolicyKnobs& k = p.knobs;
  const std::string spec = p.spec();
  if (p.retention == Retention::kStreaming) {
    if (k.sinks < 0) fail(ErrorKind::kInvalidArgument, "--sinks {}: must be >= 0", k.sinks);
    if (k.window < 0) fail(ErrorKind::kInvalidArgument, "--window {}: must be >= 0", k.window);
    if (streaming_window(k) < 1) {
      fail(ErrorKind::kInvalidArgument,
           "{} keeps --sinks {} tokens and a recent window: give --window N, or --kv-budget N larger than "
           "--sinks (window = budget - sinks)",
           spec, k.sinks);
    }
  }
  if (p.retention == Retention::kH2o || p.selection == Selection::kQuest) {
    if (k.budget <= 0) {
      fail(ErrorKind::kInvalidArgument, "{} needs --kv-budget N (tokens per sequence and layer{})", spec,
           p.retention == Retention::kH2o ? " kept" : " attended");
    }
  }
  if (p.retention == Retention::kLocret) {
    if (k.budget <= 0)
      fail(ErrorKind::kInvalidArgument, "{} needs --kv-budget N (KV units kept per layer and KV head)", spec);
    if (k.stabilizers < -1)
      fail(ErrorKind::kInvalidArgument, "--stabilizers {}: must be >= 0", k.stabilizers);
    if (locret_stabilizers(k) >= k.budget) {
      fail(ErrorKind::kInvalidArgument,
           "--stabilizers {} must be smaller than --kv-budget {} (spec: n_s < b)", locret_stabilizers(k),
           k.budget);
    }
    if (k.local_tail < 0) fail(ErrorKind::kInvalidArgument, "--local-tail {}: must be >= 0", k.local_tail);
    if (k.locret_pool < 1 || k.locret_pool % 2 == 0)
      fail(ErrorKind::kInvalidArgument, "--locret-pool {}: must be an odd number >= 1", k.locret_pool);
    check_locret_sinks(k);
    if (k.locret_positions == LocretPositions::kOriginal && p.placement != Placement::kResident) {
      fail(ErrorKind::kUnsupported,
           "{}: --locret-positions original is implemented for the resident placement only (an offloaded "
           "placement's locret keeps compact positions)",
           spec);
    }
  }
  if (p.retention == Retention::kH2o && !(k.h2o_recent > 0.0 && k.h2o_recent < 1.0))
    fail(ErrorKind::kInvalidArgument, "--h2o-recent {}: the recent share must be in (0, 1)", k.h2o_recent);
  if (p.selection == Selection::kQuest && k.quest_page < 1)
    fail(ErrorKind::kInvalidArgument, "--quest-page {}: must be >= 1", k.quest_page);
  if (p.selection == Selection::kInfinigen) {
    if (!(k.infinigen_alpha > 0.0))  // +inf allowed (the degenerate case: every row above the threshold)
      fail(ErrorKind::kInvalidArgument, "--infinigen-alpha {}: must be > 0 (inf selects every row)",
           k.infinigen_alpha);
    if (!(k.infinigen_budget > 0.0 && k.infinigen_budget <= 1.0))
      fail(ErrorKind::kInvalidArgument,
           "--infinigen-budget {}: the cap's share of the rows must be in (0, 1]", k.infinigen_budget);
  }
  if (p.retention == Retention::kPool && p.selection != Selection::kInfinigen) {
    fail(ErrorKind::kInvalidArgument,
         "{}: retention pool is InfiniGen's bounded pool and needs selection infinigen (--kv-policy "
         "layer+infinigen+pool or headinfer+infinigen+pool)",
         spec);
  }
  if (recomputes_prefix(p.representation) && k.recompute < PolicyKnobs::kRecomputeRandom)
    fail(ErrorKind::kInvalidArgument, "--recompute {}: give auto, random or a number of positions >= 0",
         k.recompute);
  if (p.representation == Representation::kHybrid && !(k.act_ratio >= 0) &&
      k.act_ratio != PolicyKnobs::kActRatioAuto)
    fail(ErrorKind::kInvalidArgument, "--act-ratio {}: give auto or a ratio of ACT to KV blocks >= 0",
         k.act_ratio);
  if (is_kivi(p.representation)) {
    if (k.kivi_group < 1) fail(ErrorKind::kInvalidArgument, "--kivi-group {}: must be >= 1", k.kivi_group);
    if (k.kivi_residual < 0)
      fail(ErrorKind::kInvalidArgument, "--kivi-residual {}: must be >= 0", k.kivi_residual);
  }
}

bool KvPolicy::exact() const {
  // Every value that exists today is lossless; the approximate ones (quantised rows, token selection,
  // eviction) will say so in their AxisValue.
  for (const AxisValue& v : kValues) {
    const bool mine = (v.axis == Axis::kPlacement && v.name == placement_name(placement)) ||
                      (v.axis == Axis::kRepresentation && representation_has(representation, v.name)) ||
                      (v.axis == Axis::kSelection && v.name == selection_name(selection)) ||
                      (v.axis == Axis::kRetention && v.name == retention_name(retention));
    if (mine && !v.exact) return false;
  }
  return true;
}

std::string KvPolicy::spec() const {
  const KvPolicy d;
  std::string s(placement_name(placement));
  if (representation != d.representation) s.append("+").append(representation_name(representation));
  if (selection != d.selection) s.append("+").append(selection_name(selection));
  if (retention != d.retention) s.append("+").append(retention_name(retention));
  return s;
}

std::span<const AxisValue> axis_values() {
  return kValues;
}

std::span<const Preset> presets() {
  return kPresets;
}

KvPolicy parse_kv_policy(std::string_view spec, const KvPolicy& defaults) {
  KvPolicy p = defaults;
  std::optional<std::string_view> seen[4];
  bool composed = false;  // the representation is kivi4+kvpr or kivi2+kvpr
  std::vector<std::string_view> parts;
  const std::vector<std::string_view> given = parts_of(spec);
  for (std::string_view part : given) {
    bool preset = false;
    for (const Preset& pr : kPresets) {
      // A name that is both a preset and a value (kvpr) is the preset alone and the value in a
      // combination ("headinfer+kvpr").
      if (pr.name == part && (given.size() == 1 || !find_value(part))) {
        for (std::string_view q : parts_of(pr.spec)) parts.push_back(q);
        preset = true;
      }
    }
    if (!preset) parts.push_back(part);
  }
  for (std::string_view part : parts) {
    const auto v = find_value(part);
    if (!v)
      fail(ErrorKind::kInvalidArgument, "unknown KV policy value '{}' in '{}' (known {})", part, spec,
           known_names());
    auto& slot = seen[static_cast<int>(v->axis)];
    // kivi4 / kivi2 with kvpr: one representation (KIVI's rows, kvpr's stored inputs and recompute).
    if (slot && v->axis == Axis::kRepresentation) {
      const auto kivi_of = [](std::string_view a, std::string_view b) -> std::optional<Representation> {
        if (b != "kvpr") return std::nullopt;
        if (a == "kivi4") return Representation::kKivi4Kvpr;
        if (a == "kivi2") return Representation::kKivi2Kvpr;
        return std::nullopt;
      };
      auto both = kivi_of(*slot, part);
      if (!both) both = kivi_of(part, *slot);
      if (both && !composed) {
        p.representation = *both;
        composed = true;
        continue;
      }
      fail(ErrorKind::kInvalidArgument,
           "KV policy '{}' names two representation values, '{}' and '{}': a policy takes one value per axis "
           "(placement x representation x selection x retention); the one pair that composes is kivi4 or "
           "kivi2 with kvpr (e.g. layer+kivi4+kvpr)",
           spec, composed ? representation_name(p.representation) : *slot, part);
    }
    if (slot) {
      fail(ErrorKind::kInvalidArgument,
           "KV policy '{}' names two {} values, '{}' and '{}': a policy takes one value per axis "
           "(placement x representation x selection x retention)",
           spec, axis_name(v->axis), *slot, part);
    }
    slot = part;
    switch (v->axis) {
      case Axis::kPlacement:
        p.placement = *placement_from_name(part);
        break;
      case Axis::kRepresentation:
        p.representation = value_of(part,
                                    {Representation::kF16, Representation::kF32, Representation::kKivi4,
                                     Representation::kKivi2, Representation::kKvpr, Representation::kHybrid},
                                    representation_name);
        break;
      case Axis::kSelection:
        p.selection =
            value_of(part, {Selection::kAll, Selection::kQuest, Selection::kInfinigen}, selection_name);
        break;
      case Axis::kRetention:
        p.retention = value_of(part,
                               {Retention::kNone, Retention::kSliding, Retention::kStreaming, Retention::kH2o,
                                Retention::kLocret, Retention::kPool},
                               retention_name);
        break;
    }
  }
  return p;
}

bool spec_names_axis(std::string_view spec, Axis axis) {
  for (std::string_view part : parts_of(spec)) {
    if (const auto v = find_value(part); v && v->axis == axis) return true;
    for (const Preset& pr : kPresets) {  // a preset stands for its spec (expanded once, not recursively)
      if (pr.name != part) continue;
      for (std::string_view q : parts_of(pr.spec)) {
        if (const auto v = find_value(q); v && v->axis == axis) return true;
      }
    }
  }
  return false;
}

std::vector<KvPolicy> parse_kv_policy_list(std::string_view list, const KvPolicy& defaults) {
  std::vector<KvPolicy> out;
  while (true) {
    const size_t comma = list.find(',');
    const KvPolicy p = parse_kv_policy(list.substr(0, comma), defaults);
    for (const KvPolicy& q : out) {
      if (q == p) fail(ErrorKind::kInvalidArgument, "KV policy '{}' is listed twice", p.spec());
    }
    out.push_back(p);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace kvtier::policy
