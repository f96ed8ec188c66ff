// The grid of `kvtier compare`: KV policies x budgets x context lengths x tasks, one cell per
// (task, length, policy, budget). A budget is a fraction of the context length, converted to
// --kv-budget tokens per length; it applies only to policies whose axis values list --kv-budget
// among their flags (h2o, quest, streaming: `kvtier policies --json`), the others run once per
// length. The reference `resident` runs first at every length, so a sweep stopped part-way has
// the reference for every length it reached.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eval/task.h"

namespace kvtier::eval {

// A fraction of the context length in (0, 1].
struct Budget {
  int64_t num = 1, den = 1;
  std::string text() const;  // "1/8"
  double value() const { return static_cast<double>(num) / static_cast<double>(den); }
  bool operator==(const Budget&) const = default;
};

// "1/2,1/4,1/8" (also "1" for the whole context). Throws Error(kInvalidArgument) for anything
// else, fractions outside (0, 1] and repeated items.
std::vector<Budget> parse_budgets(std::string_view list);
// floor(length * b); an error if that is below one token.
int64_t budget_tokens(Budget b, int64_t length);

// The spec's policy uses --kv-budget (one of its axis values lists the flag).
bool policy_takes_budget(std::string_view spec);
// Why a policy cannot run with the sweep's flags (a placement rule, a file it needs), or "" when it
// can. The CLI supplies it (kv::check_placement_options, --skew, --locret-heads); eval stays model-free.
using PolicyCheck = std::function<std::string(const std::string& spec)>;
struct SkippedPolicy {
  std::string spec;
  std::string reason;
};
// Every policy kvtier has, as canonical specs: `resident`, the other presets, then resident with
// each other value of every axis (one at a time), in `kvtier policies` order. With a check, only the
// runnable ones: a value the resident placement refuses runs on `layer` instead (resident+infinigen ->
// layer+infinigen), unless that is listed already or refused too; the refused ones go to `skipped`
// with the check's reason.
std::vector<std::string> discover_policies(const PolicyCheck& check = {},
                                           std::vector<SkippedPolicy>* skipped = nullptr);

struct SweepPolicy {
  std::string spec;  // canonical (policy::KvPolicy::spec())
  bool budgeted = false;
};
// A comma-separated list as canonical specs, `resident` first (added if missing: it is the
// reference). The item "all" stands for discover_policies(check, skipped) ("all,layer+quest": every
// policy and layer+quest); a policy named twice is an error, one that "all" also discovers is not.
std::vector<SweepPolicy> sweep_policies(std::string_view list, const PolicyCheck& check = {},
                                        std::vector<SkippedPolicy>* skipped = nullptr);

struct SweepSpec {
  std::vector<TaskKind> tasks;
  std::vector<int64_t> lengths;
  std::vector<SweepPolicy> policies;
  std::vector<Budget> budgets;
};

struct CellKey {
  TaskKind task = TaskKind::kNiah;
  int64_t length = 0;
  std::string policy;            // canonical spec
  std::optional<Budget> budget;  // none: the policy takes no budget
  int64_t budget_tokens = 0;     // --kv-budget; 0 without a budget
  std::string config() const;    // "h2o@1/8" or "resident": the policy as the report names it
  std::string label() const;     // "niah 4k h2o@1/8 (512 tokens)"
  bool operator==(const CellKey&) const = default;
};

// Every cell: lengths ascending (outermost), then the policies (each budgeted one once per
// budget), then the tasks.
std::vector<CellKey> expand_grid(const SweepSpec& spec);

std::string length_text(int64_t length);  // 4096 -> "4k", 1000 -> "1000"

}  // namespace kvtier::eval
