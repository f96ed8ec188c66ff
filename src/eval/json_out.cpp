#include "eval/json_out.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <tuple>

#include "core/error.h"

namespace kvtier::eval {
namespace {

nlohmann::json depth_json(double d) {
  return d >= 0 ? nlohmann::json(d) : nlohmann::json(nullptr);
}
nlohmann::json number_json(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json cells_json(const std::vector<Cell>& cells) {
  nlohmann::json a = nlohmann::json::array();
  for (const Cell& c : cells) {
    nlohmann::json j = {{"policy", c.policy}, {"task", std::string(task_name(c.task))}, {"n", c.n}};
    if (c.length > 0) j["length"] = c.length;
    if (c.depth_index >= 0) j["depth"] = depth_json(c.depth);
    j[c.task == TaskKind::kPpl ? "perplexity" : "accuracy"] = number_json(c.value);
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace

nlohmann::json sample_json(const SampleResult& s) {
  nlohmann::json j = {{"policy", s.policy},
                      {"task", std::string(task_name(s.task))},
                      {"length", s.length},
                      {"depth", depth_json(s.depth)},
                      {"index", s.index},
                      {"seed", s.seed},
                      {"prompt_tokens", s.prompt_tokens},
                      {"seconds", s.seconds}};
  if (s.task == TaskKind::kPpl) {
    j["nll_sum"] = s.nll_sum;
    j["n_scored"] = s.n_scored;
    j["perplexity"] = number_json(s.score);
  } else {
    j["expected"] = s.expected;
    j["answer"] = s.answer;
    j["score"] = s.score;
  }
  return j;
}

nlohmann::json results_json(const RunInfo& info, const Results& r) {
  nlohmann::json meta = {
      {"model", info.model},       {"model_name", info.model_name}, {"commit", info.commit},
      {"machine", info.machine},   {"command", info.command},       {"options", info.options},
      {"started", info.started},   {"seconds", info.seconds},       {"seed", info.seed},
      {"policies", info.policies}, {"lengths", info.lengths},       {"depths", info.depths},
      {"samples", info.samples},   {"haystack", info.haystack},
  };
  nlohmann::json tasks = nlohmann::json::array();
  for (TaskKind t : info.tasks) {
    tasks.push_back({{"name", std::string(task_name(t))},
                     {"max_new_tokens", task_max_new_tokens(t)},
                     {"scoring", std::string(task_scoring(t))}});
  }
  meta["tasks"] = tasks;
  nlohmann::json samples = nlohmann::json::array();
  for (const SampleResult& s : r.samples()) samples.push_back(sample_json(s));
  return {{"meta", meta},
          {"samples", samples},
          {"cells", cells_json(r.depth_cells())},
          {"by_length", cells_json(r.length_cells())},
          {"overall", cells_json(r.overall())}};
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(ErrorKind::kIo, "cannot write '{}'", path);
  // Answers are model text: invalid UTF-8 is replaced rather than throwing.
  out << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  if (!out) fail(ErrorKind::kIo, "write to '{}' failed", path);
}

SampleResult sample_from_json(const nlohmann::json& js, const std::vector<double>& depths) {
  SampleResult s;
  s.policy = js.at("policy").get<std::string>();
  s.task = parse_task(js.at("task").get<std::string>());
  s.length = js.at("length").get<int64_t>();
  if (!js.at("depth").is_null()) {
    s.depth = js.at("depth").get<double>();
    for (size_t d = 0; d < depths.size(); ++d) {
      if (std::abs(depths[d] - s.depth) < 1e-9) s.depth_index = static_cast<int>(d);
    }
    if (s.depth_index < 0)
      fail(ErrorKind::kInvalidFile, "sample at depth {} is not in the run's depths", s.depth);
  }
  s.index = js.at("index").get<int>();
  s.seed = js.at("seed").get<uint64_t>();
  s.prompt_tokens = js.at("prompt_tokens").get<int64_t>();
  s.seconds = js.value("seconds", 0.0);
  if (s.task == TaskKind::kPpl) {
    s.nll_sum = js.at("nll_sum").get<double>();
    s.n_scored = js.at("n_scored").get<int64_t>();
    s.score = s.n_scored > 0 ? std::exp(s.nll_sum / static_cast<double>(s.n_scored)) : 0.0;
  } else {
    s.expected = js.at("expected").get<std::vector<std::string>>();
    s.answer = js.at("answer").get<std::string>();
    s.score = js.at("score").get<double>();
  }
  return s;
}

RunRecord run_from_json(const nlohmann::json& j) {
  try {
    RunRecord run;
    const nlohmann::json& m = j.at("meta");
    RunInfo& i = run.info;
    i.model = m.at("model").get<std::string>();
    i.model_name = m.at("model_name").get<std::string>();
    i.commit = m.value("commit", "");
    i.machine = m.value("machine", "");
    i.command = m.value("command", "");
    i.options = m.value("options", "");
    i.started = m.value("started", "");
    i.seconds = m.value("seconds", 0.0);
    i.seed = m.at("seed").get<uint64_t>();
    i.policies = m.at("policies").get<std::vector<std::string>>();
    for (const auto& t : m.at("tasks")) i.tasks.push_back(parse_task(t.at("name").get<std::string>()));
    i.lengths = m.at("lengths").get<std::vector<int64_t>>();
    i.depths = m.at("depths").get<std::vector<double>>();
    i.samples = m.at("samples").get<int>();
    i.haystack = m.value("haystack", "");
    for (const auto& js : j.at("samples")) run.results.add(sample_from_json(js, i.depths));
    return run;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidFile, "not an eval results file: {}", e.what());
  }
}

RunRecord read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot read '{}'", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInvalidFile, "'{}': {}", path, e.what());
  }
  return run_from_json(j);
}

namespace {

template <typename T>
void add_unique(std::vector<T>& v, const T& x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

}  // namespace

RunRecord merge_runs(const std::vector<RunRecord>& runs) {
  if (runs.empty()) fail(ErrorKind::kInvalidArgument, "no runs to merge");
  RunRecord out;
  RunInfo& i = out.info;
  const RunInfo& first = runs.front().info;
  i.model = first.model;
  i.model_name = first.model_name;
  i.machine = first.machine;
  i.haystack = first.haystack;
  i.seed = first.seed;
  i.started = first.started;
  std::vector<std::string> commands, commits, options, machines;
  for (const RunRecord& r : runs) {
    const RunInfo& ri = r.info;
    if (ri.model_name != first.model_name)
      fail(ErrorKind::kInvalidArgument, "runs of different models: {} and {}", first.model_name,
           ri.model_name);
    if (ri.seed != first.seed)
      fail(ErrorKind::kInvalidArgument, "runs with different seeds: {} and {}", first.seed, ri.seed);
    add_unique(commands, ri.command);
    add_unique(commits, ri.commit);
    add_unique(options, ri.options);
    add_unique(machines, ri.machine);
    if (!ri.started.empty() && (i.started.empty() || ri.started < i.started)) i.started = ri.started;
    i.seconds += ri.seconds;
    i.samples = std::max(i.samples, ri.samples);
    for (const auto& p : ri.policies) add_unique(i.policies, p);
    for (TaskKind t : ri.tasks) add_unique(i.tasks, t);
    for (int64_t l : ri.lengths) add_unique(i.lengths, l);
    for (double d : ri.depths) add_unique(i.depths, d);
  }
  std::sort(i.lengths.begin(), i.lengths.end());
  std::sort(i.depths.begin(), i.depths.end());
  i.command = join(commands, "`; `");  // the report prints it as inline code
  i.commit = join(commits, ", ");
  i.options = join(options, "; ");
  i.machine = join(machines, "; ");

  using Key = std::tuple<std::string, int, int64_t, double, int, uint64_t>;
  std::map<Key, const SampleResult*> seen;
  for (const RunRecord& r : runs) {
    for (const SampleResult& s : r.results.samples()) {
      const Key key{s.policy, static_cast<int>(s.task), s.length, s.depth, s.index, s.seed};
      auto [it, inserted] = seen.emplace(key, &s);
      if (!inserted) {
        const SampleResult& a = *it->second;
        if (a.answer != s.answer || a.score != s.score || a.nll_sum != s.nll_sum)
          fail(ErrorKind::kInvalidArgument,
               "{} {} {} depth {} #{} is in two runs with different answers: '{}' and '{}'", s.policy,
               task_name(s.task), s.length, s.depth, s.index, a.answer, s.answer);
        continue;
      }
      SampleResult m = s;
      if (m.depth_index >= 0) {
        m.depth_index =
            static_cast<int>(std::find(i.depths.begin(), i.depths.end(), m.depth) - i.depths.begin());
      }
      out.results.add(std::move(m));
    }
  }
  return out;
}

}  // namespace kvtier::eval
