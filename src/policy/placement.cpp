#include "policy/placement.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier::policy {
namespace {

constexpr Placement kPlacements[] = {Placement::kResident, Placement::kLayer, Placement::kHeadInfer};

uint32_t max_heads(const KvShape& s) {
  return *std::max_element(s.n_head_kv.begin(), s.n_head_kv.end());
}

// g is valid when it divides the KV heads of every layer that has more than g heads.
bool valid_group(const KvShape& s, uint32_t g) {
  for (uint32_t h : s.n_head_kv) {
    if (h > g && h % g != 0) return false;
  }
  return true;
}

uint64_t buffer_bytes(const KvShape& s, uint32_t g, int64_t tokens, uint32_t buffers) {
  return uint64_t{buffers} * g * s.head_bytes_per_token * static_cast<uint64_t>(tokens);
}

}  // namespace

std::string_view placement_name(Placement p) {
  switch (p) {
    case Placement::kResident:
      return "resident";
    case Placement::kLayer:
      return "layer";
    case Placement::kHeadInfer:
      return "headinfer";
  }
  return "?";
}

std::string placement_names() {
  std::string s;
  for (Placement p : all_placements()) {
    if (!s.empty()) s += ", ";
    s += placement_name(p);
  }
  return s;
}

Placement parse_placement(std::string_view name) {
  if (auto p = placement_from_name(name)) return *p;
  fail(ErrorKind::kInvalidArgument, "unknown KV policy '{}' (this build has: {})", name, placement_names());
}

std::vector<Placement> parse_placement_list(std::string_view list) {
  std::vector<Placement> out;
  while (true) {
    const size_t comma = list.find(',');
    const Placement p = parse_placement(list.substr(0, comma));
    for (Placement q : out) {
      if (q == p) fail(ErrorKind::kInvalidArgument, "KV policy '{}' is listed twice", placement_name(p));
    }
    out.push_back(p);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

std::optional<Placement> placement_from_name(std::string_view name) {
  for (Placement p : kPlacements) {
    if (placement_name(p) == name) return p;
  }
  return std::nullopt;
}

std::span<const Placement> all_placements() {
  return kPlacements;
}

RowsForGroup exact_rows(const KvShape& s, uint32_t buffers, uint64_t arena_bytes) {
  return [=](uint32_t g) {
    return static_cast<int64_t>(arena_bytes / (uint64_t{buffers} * g * s.head_bytes_per_token));
  };
}

uint32_t memory_rule_group(const KvShape& s, int64_t tokens, uint32_t buffers, uint64_t arena_bytes) {
  const RowsForGroup rows = exact_rows(s, buffers, arena_bytes);
  for (uint32_t g = max_heads(s); g >= 1; --g) {
    if (valid_group(s, g) && rows(g) >= tokens) return g;
  }
  return 0;
}

uint32_t choose_group(const PlacementConfig& c, const KvShape& s, int64_t s_kv, const RowsForGroup& rows) {
  const uint32_t all = max_heads(s);
  if (c.placement == Placement::kLayer) return rows(all) >= s_kv ? all : 0;
  if (c.group != 0) return rows(c.group) >= s_kv ? c.group : 0;
  uint32_t g = 0;
  for (uint32_t cand = all; cand >= 1 && g == 0; --cand) {
    if (valid_group(s, cand) && rows(cand) >= s_kv) g = cand;
  }
  // Threshold rule: halve g at each threshold passed (8 -> 4 -> 2 -> 1 for Llama-3-8B).
  uint32_t t = all;
  for (int64_t th : c.group_thresholds) {
    if (s_kv > th) t = std::max<uint32_t>(1, t / 2);
  }
  while (t > 1 && !valid_group(s, t)) --t;
  return std::min(g, t);
}

PassPlan plan_pass(const PlacementConfig& c, const KvShape& s, int64_t s_kv, const RowsForGroup& rows) {
  if (s.n_head_kv.empty() || s.head_bytes_per_token == 0) fail(ErrorKind::kInvalidArgument, "empty KV shape");
  if (c.group != 0 && !valid_group(s, c.group)) {
    fail(ErrorKind::kInvalidArgument, "--group {} does not divide the KV heads of every layer", c.group);
  }
  PassPlan plan;
  plan.group = choose_group(c, s, s_kv, rows);
  if (plan.group == 0) {
    const uint32_t g = c.placement == Placement::kLayer ? max_heads(s) : std::max<uint32_t>(c.group, 1);
    fail(ErrorKind::kBudget,
         "staging buffers for units of {} KV head(s) hold {} tokens; this pass needs {} (about {} bytes of "
         "compute-local memory); raise --kv-mem, lower --ctx, or use headinfer with a smaller --group",
         g, rows(g), s_kv, buffer_bytes(s, g, s_kv, c.prefetch_depth + 1));
  }
  plan.unit_capacity = rows(plan.group);
  const std::vector<uint32_t> n_static = static_heads_per_layer(c, s);
  for (uint32_t l = 0; l < s.n_head_kv.size(); ++l) {
    const uint32_t heads = s.n_head_kv[l];
    if (n_static[l] > 0) plan.units.push_back({l, 0, n_static[l], true});
    for (uint32_t h0 = n_static[l]; h0 < heads; h0 += plan.group) {
      plan.units.push_back({l, h0, std::min(plan.group, heads - h0), false});
    }
  }
  return plan;
}

std::vector<uint32_t> static_heads_per_layer(const PlacementConfig& c, const KvShape& s) {
  std::vector<uint32_t> out(s.n_head_kv.size(), 0);
  if (c.placement == Placement::kResident) return s.n_head_kv;
  if (c.placement != Placement::kHeadInfer) return out;
  uint64_t left = c.static_heads;
  for (size_t l = 0; l < out.size() && left > 0; ++l) {
    out[l] = static_cast<uint32_t>(std::min<uint64_t>(left, s.n_head_kv[l]));
    left -= out[l];
  }
  return out;
}

}  // namespace kvtier::policy
