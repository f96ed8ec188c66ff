#include "eval/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "policy/kv_policy.h"

namespace kvtier::eval {
namespace {

std::vector<std::string_view> split_list(std::string_view s) {
  std::vector<std::string_view> out;
  while (true) {
    const size_t comma = s.find(',');
    out.push_back(s.substr(0, comma));
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

bool parse_int(std::string_view s, int64_t& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// The axis values a policy is made of, as `kvtier policies` lists them.
std::vector<policy::AxisValue> values_of(const policy::KvPolicy& p) {
  std::vector<policy::AxisValue> out;
  for (const policy::AxisValue& v : policy::axis_values()) {
    if ((v.axis == policy::Axis::kPlacement && v.name == policy::placement_name(p.placement)) ||
        (v.axis == policy::Axis::kRepresentation && policy::representation_has(p.representation, v.name)) ||
        (v.axis == policy::Axis::kSelection && v.name == policy::selection_name(p.selection)) ||
        (v.axis == policy::Axis::kRetention && v.name == policy::retention_name(p.retention)))
      out.push_back(v);
  }
  return out;
}

bool lists_flag(std::string_view flags, std::string_view flag) {
  while (!flags.empty()) {
    const size_t sp = flags.find(' ');
    if (flags.substr(0, sp) == flag) return true;
    if (sp == std::string_view::npos) break;
    flags.remove_prefix(sp + 1);
  }
  return false;
}

}  // namespace

std::string Budget::text() const {
  return den == 1 ? fmt::format("{}", num) : fmt::format("{}/{}", num, den);
}

std::vector<Budget> parse_budgets(std::string_view list) {
  std::vector<Budget> out;
  for (std::string_view item : split_list(list)) {
    Budget b;
    const size_t slash = item.find('/');
    const bool ok = slash == std::string_view::npos
                        ? parse_int(item, b.num)
                        : parse_int(item.substr(0, slash), b.num) && parse_int(item.substr(slash + 1), b.den);
    if (!ok || b.num <= 0 || b.den <= 0 || b.num > b.den)
      fail(ErrorKind::kInvalidArgument,
           "--budgets: '{}' is not a fraction of the context in (0, 1] (e.g. 1/8)", item);
    for (const Budget& o : out) {
      if (o.num * b.den == b.num * o.den)
        fail(ErrorKind::kInvalidArgument, "--budgets: '{}' is listed twice (as {})", item, o.text());
    }
    out.push_back(b);
  }
  return out;
}

int64_t budget_tokens(Budget b, int64_t length) {
  const int64_t t = length * b.num / b.den;
  if (t < 1)
    fail(ErrorKind::kInvalidArgument, "budget {} of {} tokens is less than one token", b.text(), length);
  return t;
}

bool policy_takes_budget(std::string_view spec) {
  const policy::KvPolicy p = policy::parse_kv_policy(spec);
  for (const policy::AxisValue& v : values_of(p)) {
    if (lists_flag(v.flags, "--kv-budget")) return true;
  }
  return false;
}

std::vector<std::string> discover_policies(const PolicyCheck& check, std::vector<SkippedPolicy>* skipped) {
  std::vector<std::string> out, tried;
  const auto seen = [&](const std::string& s) {
    return std::find(tried.begin(), tried.end(), s) != tried.end();
  };
  // Adds `spec` if it runs, else `fallback` (the value on an offloaded placement) if that runs.
  const auto add = [&](const std::string& spec, const std::string& fallback = {}) {
    if (seen(spec)) return;
    tried.push_back(spec);
    const std::string why = check ? check(spec) : std::string();
    if (why.empty()) {
      out.push_back(spec);
      return;
    }
    if (!fallback.empty()) {
      if (seen(fallback)) return;  // listed (or skipped) already, under its own name
      tried.push_back(fallback);
      const std::string why_fb = check(fallback);
      if (why_fb.empty()) {
        out.push_back(fallback);
        return;
      }
      if (skipped != nullptr) skipped->push_back({fallback, why_fb});
      return;
    }
    if (skipped != nullptr) skipped->push_back({spec, why});
  };
  add("resident");
  for (const policy::Preset& pr : policy::presets()) add(policy::parse_kv_policy(pr.spec).spec());
  const policy::KvPolicy defaults;
  for (const policy::AxisValue& v : policy::axis_values()) {
    if (v.axis == policy::Axis::kPlacement) {
      add(policy::parse_kv_policy(v.name).spec());
      continue;
    }
    const policy::KvPolicy p = policy::parse_kv_policy(fmt::format("resident+{}", v.name));
    if (p == defaults) continue;
    if (p.retention == policy::Retention::kPool) {  // InfiniGen's bounded pool runs only with its selection
      add(policy::parse_kv_policy(fmt::format("layer+infinigen+{}", v.name)).spec());
      continue;
    }
    add(p.spec(), policy::parse_kv_policy(fmt::format("layer+{}", v.name)).spec());
  }
  return out;
}

std::vector<SweepPolicy> sweep_policies(std::string_view list, const PolicyCheck& check,
                                        std::vector<SkippedPolicy>* skipped) {
  std::vector<std::string> specs, named;  // named: the canonical specs of the items other than "all"
  std::string joined;
  for (std::string_view item : split_list(list)) {
    if (item.empty()) fail(ErrorKind::kInvalidArgument, "--kv-policy '{}': an empty item", list);
    if (item != "all") joined.append(joined.empty() ? "" : ",").append(item);
  }
  if (!joined.empty()) {  // unknown or repeated items are errors
    for (const policy::KvPolicy& p : policy::parse_kv_policy_list(joined)) named.push_back(p.spec());
  }
  size_t next_named = 0;
  for (std::string_view item : split_list(list)) {
    if (item == "all") {
      for (std::string& s : discover_policies(check, skipped)) {
        if (std::find(specs.begin(), specs.end(), s) == specs.end()) specs.push_back(std::move(s));
      }
    } else {
      const std::string& s = named[next_named++];
      if (std::find(specs.begin(), specs.end(), s) == specs.end()) specs.push_back(s);
    }
  }
  const auto res = std::find(specs.begin(), specs.end(), "resident");
  if (res == specs.end()) {
    specs.insert(specs.begin(), "resident");
  } else {
    std::rotate(specs.begin(), res, res + 1);
  }
  std::vector<SweepPolicy> out;
  for (const std::string& s : specs) out.push_back({s, policy_takes_budget(s)});
  return out;
}

std::string length_text(int64_t length) {
  return length % 1024 == 0 ? fmt::format("{}k", length / 1024) : fmt::format("{}", length);
}

std::string CellKey::config() const {
  return budget ? fmt::format("{}@{}", policy, budget->text()) : policy;
}

std::string CellKey::label() const {
  std::string s = fmt::format("{} {} {}", task_name(task), length_text(length), config());
  if (budget) s += fmt::format(" ({} tokens)", budget_tokens);
  return s;
}

std::vector<CellKey> expand_grid(const SweepSpec& spec) {
  if (spec.tasks.empty()) fail(ErrorKind::kInvalidArgument, "no task to run");
  if (spec.lengths.empty()) fail(ErrorKind::kInvalidArgument, "no context length to run");
  if (spec.policies.empty()) fail(ErrorKind::kInvalidArgument, "no KV policy to run");
  bool any_budgeted = false;
  for (const SweepPolicy& p : spec.policies) any_budgeted |= p.budgeted;
  if (any_budgeted && spec.budgets.empty())
    fail(ErrorKind::kInvalidArgument, "the policies include budgeted ones but --budgets is empty");
  std::vector<int64_t> lengths = spec.lengths;
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  std::vector<CellKey> out;
  for (int64_t len : lengths) {
    for (const SweepPolicy& p : spec.policies) {
      std::vector<std::optional<Budget>> budgets;
      if (p.budgeted) {
        for (const Budget& b : spec.budgets) budgets.emplace_back(b);
      } else {
        budgets.emplace_back(std::nullopt);
      }
      for (const auto& b : budgets) {
        for (TaskKind t : spec.tasks) {
          CellKey k;
          k.task = t;
          k.length = len;
          k.policy = p.spec;
          k.budget = b;
          k.budget_tokens = b ? budget_tokens(*b, len) : 0;
          out.push_back(std::move(k));
        }
      }
    }
  }
  return out;
}

}  // namespace kvtier::eval
