// The report of a compare sweep: README.md with a summary, accuracy relative to `resident` per task
// and length, KV bytes per tier and bytes moved, prefill and decode speed; SVG plots of accuracy
// against compression (one per task) and of speed against context length (one panel per budget).
// Everything is computed from the results file(s), so a partial sweep gives a partial report that
// says which cells are missing.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "eval/sweep_store.h"

namespace kvtier::eval {

// One row of the summary: a policy at a budget, over every length and task it ran.
struct ConfigSummary {
  std::string config;  // "resident+h2o@1/8"
  std::string policy;
  std::optional<Budget> budget;
  double kv_ratio = NAN;      // KV bytes (all tiers) / resident's, mean over lengths
  double rel_accuracy = NAN;  // sum of scores / resident's sum on the same cells (tasks other than ppl)
  double same_answers = NAN;  // share of samples whose answer equals resident's
  int cells = 0;
};

// Relative accuracy of one cell: score / resident's score (ppl: resident's perplexity / its own);
// NaN if the resident cell is missing or scored 0.
double relative_accuracy(const CellResult& c, const CellResult& resident);

// The summary rows in the order configs first appear in the cells.
std::vector<ConfigSummary> summarize(const std::vector<CellResult>& cells);

// File name -> contents. `records`: one or more results files of one model (cells are merged, the
// first copy of a cell counts).
std::map<std::string, std::string> sweep_report_files(const std::vector<SweepRecord>& records);
// The report's Markdown (the README.md above) with plots under `plot_dir` (e.g. "policies/smollm2/").
std::string sweep_markdown(const std::vector<SweepRecord>& records, const std::string& plot_dir);
void write_sweep_report(const std::string& dir, const std::vector<SweepRecord>& records);

}  // namespace kvtier::eval
