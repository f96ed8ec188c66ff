#include "eval/kv_policy.h"

#include <array>

#include "core/error.h"

namespace kvtier::eval {
namespace {

constexpr std::array kPolicies = {KvPolicy::kResident};

}  // namespace

std::string_view kv_policy_name(KvPolicy p) {
  switch (p) {
    case KvPolicy::kResident:
      return "resident";
  }
  return "?";
}

std::string kv_policy_names() {
  std::string s;
  for (KvPolicy p : kPolicies) {
    if (!s.empty()) s += ", ";
    s += kv_policy_name(p);
  }
  return s;
}

KvPolicy parse_kv_policy(std::string_view name) {
  for (KvPolicy p : kPolicies) {
    if (kv_policy_name(p) == name) return p;
  }
  fail(ErrorKind::kInvalidArgument, "unknown KV policy '{}' (this build has: {})", name, kv_policy_names());
}

std::vector<KvPolicy> parse_kv_policy_list(std::string_view list) {
  std::vector<KvPolicy> out;
  while (true) {
    const size_t comma = list.find(',');
    const KvPolicy p = parse_kv_policy(list.substr(0, comma));
    for (KvPolicy q : out) {
      if (q == p) fail(ErrorKind::kInvalidArgument, "KV policy '{}' is listed twice", kv_policy_name(p));
    }
    out.push_back(p);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace kvtier::eval
