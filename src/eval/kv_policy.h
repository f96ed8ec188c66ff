// KV policy names accepted by `kvtier eval --kv-policy`. The engine has no runtime policy type yet
// (only resident placement exists); this is the one place that maps names to policies, to be moved
// into src/runtime (or src/policy) when the engine owns policy selection.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvtier::eval {

enum class KvPolicy : uint8_t {
  kResident,  // every KV block in compute-local memory
};

std::string_view kv_policy_name(KvPolicy p);
// Known names, comma-separated.
std::string kv_policy_names();
// Throws Error(kInvalidArgument) naming the known policies.
KvPolicy parse_kv_policy(std::string_view name);
// "resident,layer" -> policies in order; duplicates are an error.
std::vector<KvPolicy> parse_kv_policy_list(std::string_view list);

}  // namespace kvtier::eval
