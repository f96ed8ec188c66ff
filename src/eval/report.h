// The report directory: README.md with a Markdown table per task (policies x lengths, and length x
// depth per policy for needle tasks) and SVG plots: a needle heatmap per task and policy, and
// value-vs-length lines comparing the policies.
#pragma once

#include <map>
#include <string>

#include "eval/results.h"

namespace kvtier::eval {

// File name -> contents of every file of the report.
std::map<std::string, std::string> report_files(const RunInfo& info, const Results& r);
// The Markdown tables of one task (used in README.md and docs/accuracy.md). `plot_dir` prefixes
// the plots' paths ("" for the report's own README).
std::string task_markdown(const RunInfo& info, const Results& r, TaskKind t, const std::string& plot_dir);
// Writes report_files() into `dir` (created if missing).
void write_report(const std::string& dir, const RunInfo& info, const Results& r);

}  // namespace kvtier::eval
