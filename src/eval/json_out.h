// The results as JSON: run metadata, every sample, and the cells per depth, per length and overall.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/results.h"

namespace kvtier::eval {

// One sample as results_json writes it, and back (`depths`: the run's depth grid, which gives the
// sample's depth index; a depth not in it is an error). Throws nlohmann::json errors on a bad shape.
nlohmann::json sample_json(const SampleResult& s);
SampleResult sample_from_json(const nlohmann::json& j, const std::vector<double>& depths);

nlohmann::json results_json(const RunInfo& info, const Results& r);
void write_json_file(const std::string& path, const nlohmann::json& j);

// A run read back from results_json's output: its metadata and samples (cells are recomputed).
struct RunRecord {
  RunInfo info;
  Results results;
};
RunRecord run_from_json(const nlohmann::json& j);
RunRecord read_json_file(const std::string& path);

// Several runs of one model as one, so that a grid run in parts (one length per process, say)
// gets one report: samples concatenated; lengths and depths are the sorted unions, tasks and
// policies the unions in first-seen order, commands, commits and options listed, seconds summed,
// `samples` the largest. A sample present in several runs (same policy, task, length, depth,
// index and seed) is kept once; it is an error if its answers differ, or if the models or seeds do.
RunRecord merge_runs(const std::vector<RunRecord>& runs);

}  // namespace kvtier::eval
