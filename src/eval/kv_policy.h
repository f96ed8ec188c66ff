// KV policy lists of `kvtier eval --kv-policy P1,P2,...`: names are the engine's placements
// (policy::Placement); an unknown or repeated name is an error naming the known ones.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "policy/placement.h"

namespace kvtier::eval {

// Known names, comma-separated.
std::string kv_policy_names();
// Throws Error(kInvalidArgument) naming the known policies.
policy::Placement parse_kv_policy(std::string_view name);
// "resident,layer" -> policies in order; duplicates are an error.
std::vector<policy::Placement> parse_kv_policy_list(std::string_view list);

}  // namespace kvtier::eval
