// kvtier policies [--json] [--check SPEC]
// Lists the KV policy presets, the axes and their values (which are exact, what each does and the
// flags that tune it); --check parses a spec and prints the combination it stands for.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "policy/kv_policy.h"

namespace kvtier::cli {
namespace {

struct PoliciesArgs {
  bool json = false;
  std::string check;
};

nlohmann::ordered_json policy_json(const policy::KvPolicy& p) {
  return {{"spec", p.spec()},
          {"placement", std::string(policy::placement_name(p.placement))},
          {"representation", std::string(policy::representation_name(p.representation))},
          {"selection", std::string(policy::selection_name(p.selection))},
          {"retention", std::string(policy::retention_name(p.retention))},
          {"exact", p.exact()}};
}

int run_policies(const PoliciesArgs& a) {
  if (!a.check.empty()) {
    const policy::KvPolicy p = policy::parse_kv_policy(a.check);
    if (a.json) {
      std::cout << policy_json(p).dump() << "\n";
    } else {
      fmt::print("{} = placement {} x representation {} x selection {} x retention {} ({})\n", a.check,
                 policy::placement_name(p.placement), policy::representation_name(p.representation),
                 policy::selection_name(p.selection), policy::retention_name(p.retention),
                 p.exact() ? "exact: bit-identical to resident" : "approximate");
    }
    return 0;
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["presets"] = nlohmann::ordered_json::array();
    for (const auto& pr : policy::presets()) {
      nlohmann::ordered_json r = policy_json(policy::parse_kv_policy(pr.spec));
      r["name"] = std::string(pr.name);
      r["help"] = std::string(pr.help);
      j["presets"].push_back(r);
    }
    j["compose"] = {{"representation", "kivi4+kvpr kivi2+kvpr"},
                    {"help", std::string(policy::representation_compose_note())},
                    {"flags", "--recompute --kivi-group --kivi-residual"}};
    j["axes"] = nlohmann::ordered_json::array();
    for (const auto& v : policy::axis_values()) {
      j["axes"].push_back({{"axis", std::string(policy::axis_name(v.axis))},
                           {"value", std::string(v.name)},
                           {"exact", v.exact},
                           {"help", std::string(v.help)},
                           {"flags", std::string(v.flags)}});
    }
    std::cout << j.dump(1) << "\n";
    return 0;
  }
  fmt::print(
      "A KV policy is placement x representation x selection x retention. --kv-policy takes a preset or\n"
      "values joined by '+' (e.g. layer+sliding); axes left out take their defaults (representation:\n"
      "--kv-type). Exact policies give bit-identical tokens and logits to resident.\n\nPresets:\n");
  for (const auto& pr : policy::presets()) {
    const policy::KvPolicy p = policy::parse_kv_policy(pr.spec);
    fmt::print("  {:<12} {:<7} {}\n", pr.name, p.exact() ? "exact" : "approx", pr.help);
  }
  std::string_view axis;
  for (const auto& v : policy::axis_values()) {
    if (axis != policy::axis_name(v.axis)) {
      axis = policy::axis_name(v.axis);
      fmt::print("\n{}:\n", axis);
    }
    fmt::print("  {:<12} {:<7} {}{}\n", v.name, v.exact ? "exact" : "approx", v.help,
               v.flags.empty() ? "" : fmt::format(" ({})", v.flags));
    if (v.axis == policy::Axis::kRepresentation && v.name == "kivi2")
      fmt::print("  {:<12} {:<7} {} (--recompute --kivi-group --kivi-residual)\n", "kivi4+kvpr", "approx",
                 policy::representation_compose_note());
  }
  return 0;
}

}  // namespace

void add_policies(CLI::App& app, Runner& run) {
  auto a = std::make_shared<PoliciesArgs>();
  CLI::App* cmd = app.add_subcommand("policies", "List KV policy presets, axes and values (which are exact)");
  cmd->add_flag("--json", a->json, "print JSON");
  cmd->add_option("--check", a->check, "parse a --kv-policy spec and print the combination it stands for");
  cmd->callback([&run, a] { run = [a] { return run_policies(*a); }; });
}

}  // namespace kvtier::cli
