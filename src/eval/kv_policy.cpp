#include "eval/kv_policy.h"

#include "core/error.h"

namespace kvtier::eval {

std::string kv_policy_names() {
  std::string s;
  for (policy::Placement p : policy::all_placements()) {
    if (!s.empty()) s += ", ";
    s += policy::placement_name(p);
  }
  return s;
}

policy::Placement parse_kv_policy(std::string_view name) {
  if (auto p = policy::placement_from_name(name)) return *p;
  fail(ErrorKind::kInvalidArgument, "unknown KV policy '{}' (this build has: {})", name, kv_policy_names());
}

std::vector<policy::Placement> parse_kv_policy_list(std::string_view list) {
  std::vector<policy::Placement> out;
  while (true) {
    const size_t comma = list.find(',');
    const policy::Placement p = parse_kv_policy(list.substr(0, comma));
    for (policy::Placement q : out) {
      if (q == p)
        fail(ErrorKind::kInvalidArgument, "KV policy '{}' is listed twice", policy::placement_name(p));
    }
    out.push_back(p);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace kvtier::eval
