#include "eval/json_out.h"

#include <cmath>
#include <fstream>

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
  for (const SampleResult& s : r.samples()) {
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
    samples.push_back(std::move(j));
  }
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

}  // namespace kvtier::eval
