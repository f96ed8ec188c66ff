// Results of an evaluation: one record per (policy, sample), cells of the grid aggregated from
// them, and the run's metadata.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "eval/task.h"

namespace kvtier::eval {

struct SampleResult {
  std::string policy;
  TaskKind task = TaskKind::kNiah;
  int64_t length = 0;
  int depth_index = -1;
  double depth = -1.0;
  int index = 0;
  uint64_t seed = 0;
  int64_t prompt_tokens = 0;
  std::vector<std::string> expected;
  std::string answer;  // the model's text after the answer prefix
  double score = 0.0;  // fraction of `expected` found (tasks with answers)
  // ppl: NLL summed over the scored tokens and their number.
  double nll_sum = 0.0;
  int64_t n_scored = 0;
  double seconds = 0.0;  // wall time of this sample
};

// A cell of the grid. For ppl, `value` is the perplexity over all its windows; else the mean score.
struct Cell {
  std::string policy;
  TaskKind task = TaskKind::kNiah;
  int64_t length = 0;
  int depth_index = -1;  // -1: all depths together (a length's row) or no depth axis
  double depth = -1.0;
  int n = 0;
  double value = 0.0;
};

struct RunInfo {
  std::string model;       // path
  std::string model_name;  // general.name or the file name
  std::string commit;      // git commit of the binary's source, if known
  std::string machine;     // CPU model, cores
  std::string command;     // the command line
  std::string options;     // engine / policy options as text
  std::string started;     // ISO 8601 time
  double seconds = 0.0;
  uint64_t seed = 0;
  std::vector<std::string> policies;
  std::vector<TaskKind> tasks;
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  int samples = 0;
  std::string haystack;  // where the text came from
};

class Results {
 public:
  void add(SampleResult r) { samples_.push_back(std::move(r)); }
  const std::vector<SampleResult>& samples() const { return samples_; }

  // Cells per (policy, task, length, depth) for tasks with depth, in grid order.
  std::vector<Cell> depth_cells() const;
  // Cells per (policy, task, length) over all depths.
  std::vector<Cell> length_cells() const;
  // One per (policy, task) over everything.
  std::vector<Cell> overall() const;

 private:
  std::vector<Cell> aggregate(bool by_length, bool by_depth) const;
  std::vector<SampleResult> samples_;
};

// Samples where two policies disagree (different answers or scores) on the same prompt.
struct Mismatch {
  std::string policy_a, policy_b;
  TaskKind task;
  int64_t length;
  double depth;
  int index;
  std::string answer_a, answer_b;
};
std::vector<Mismatch> compare_policies(const Results& r, const std::string& reference,
                                       const std::string& other);

}  // namespace kvtier::eval
