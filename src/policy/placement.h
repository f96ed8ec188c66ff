// KV placement policies and their pure decision logic (plan, then the kv layer applies).
//   resident  : every unit always in compute-local memory
//   layer     : one unit per layer (all its KV heads), offloaded, next unit prefetched
//   headinfer : units of g KV heads per layer, offloaded, flattened (layer, group) prefetch schedule,
//               optional static (always resident) units, adaptive g
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier::policy {

enum class Placement { kResident, kLayer, kHeadInfer };

std::string_view placement_name(Placement p);
std::optional<Placement> placement_from_name(std::string_view name);
std::span<const Placement> all_placements();
// Known names, comma-separated ("resident, layer, headinfer").
std::string placement_names();
// A name as the CLI takes it; throws Error(kInvalidArgument) naming the known ones.
Placement parse_placement(std::string_view name);
// "resident,layer" -> placements in order; an unknown or repeated name is an error.
std::vector<Placement> parse_placement_list(std::string_view list);

struct PlacementConfig {
  Placement placement = Placement::kResident;
  uint32_t group = 0;           // headinfer: KV heads per unit; 0 = adaptive
  uint32_t prefetch_depth = 1;  // units loaded ahead (buffers = depth + 1)
  uint32_t static_heads = 0;    // headinfer: the first KV heads in (layer, head) order kept resident
  // headinfer adaptive: context thresholds (post-append tokens) at which g halves; the paper's
  // Llama-3-8B table is 500K / 1M / 2M (K = 1024). Empty: memory rule only.
  std::vector<int64_t> group_thresholds = {500 * 1024, 1024 * 1024, 2048 * 1024};
};

// The KV shape the schedule needs (no backend types).
struct KvShape {
  std::vector<uint32_t> n_head_kv;    // [n_layer]
  uint64_t head_bytes_per_token = 0;  // K + V of one head for one token, in the stored dtype
};

// A unit of KV moved and attended as one: heads [head0, head0 + n_heads) of a layer. A layer's
// static heads (a prefix of its heads) form one static unit; its other heads form offloaded units
// of `group` heads (the last one may be smaller).
struct Unit {
  uint32_t layer = 0;
  uint32_t head0 = 0;
  uint32_t n_heads = 0;
  bool is_static = false;
};

// The decisions for one forward pass (a prefill chunk or a decode step).
struct PassPlan {
  uint32_t group = 0;         // KV heads per offloaded unit (clipped per layer to its heads)
  int64_t unit_capacity = 0;  // tokens each staging buffer holds for this group
  std::vector<Unit> units;    // flattened schedule, layer-major, head-minor
};

// Static heads of each layer: [n_layer], a prefix of the heads, filled in (layer, head) order.
std::vector<uint32_t> static_heads_per_layer(const PlacementConfig& c, const KvShape& s);

// The largest g dividing every layer's KV heads (or clipped to them) such that `buffers` staging
// buffers of g heads hold `tokens` tokens within `arena_bytes`; 0 if g = 1 does not fit.
uint32_t memory_rule_group(const KvShape& s, int64_t tokens, uint32_t buffers, uint64_t arena_bytes);

// Tokens a staging buffer holds when it is laid out for units of g heads (the executor's layout,
// page rounding included).
using RowsForGroup = std::function<int64_t(uint32_t g)>;

// Rows per buffer when `buffers` buffers share `arena_bytes` exactly (no rounding).
RowsForGroup exact_rows(const KvShape& s, uint32_t buffers, uint64_t arena_bytes);

// g for a pass with `s_kv` tokens after the append: the smaller of the memory rule (largest valid
// g whose buffers hold s_kv tokens) and the threshold rule; for layer placement all heads; 0 when
// nothing fits.
uint32_t choose_group(const PlacementConfig& c, const KvShape& s, int64_t s_kv, const RowsForGroup& rows);

// Plans one pass; throws Error(kBudget) when no group size holds s_kv tokens.
PassPlan plan_pass(const PlacementConfig& c, const KvShape& s, int64_t s_kv, const RowsForGroup& rows);

}  // namespace kvtier::policy
