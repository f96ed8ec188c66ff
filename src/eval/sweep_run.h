// Runs the cells of a compare sweep through an engine that can be set up per cell (policy,
// --kv-budget, context length) and measured (KV bytes per tier, bytes moved, prefill and decode
// time). Each cell is the eval harness (run_eval) on one task at one length under one policy;
// its line is appended to the results file as soon as it finishes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "eval/runner.h"
#include "eval/sweep.h"
#include "eval/sweep_store.h"

namespace kvtier::eval {

struct CellMeasures {
  KvBytes kv;  // peak KV bytes per tier
  uint64_t bytes_loaded = 0, bytes_stored = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0.0, decode_s = 0.0;
  int threads = 0;
};

class SweepEngine : public Engine {
 public:
  // Later calls run the cell's policy with its --kv-budget in a KV cache of cell.length tokens;
  // measurements start again from zero. run_eval then calls use_policy(cell.config()).
  virtual void configure(const CellKey& cell) = 0;
  // What was measured since configure().
  virtual CellMeasures measures() const = 0;
};

struct SweepOptions {
  std::vector<double> depths;
  int samples = 1;
  uint64_t seed = 0;
  std::string ppl_text;                  // empty: generated
  std::string commit, machine, command;  // recorded with each cell
};

struct SweepProgress {
  int64_t done = 0, total = 0;  // cells of the grid, those already in the file counted as done
  int64_t resumed = 0;          // cells found in the file
  double elapsed_s = 0.0, eta_s = -1.0;
  std::string current;
};
using SweepProgressSink = std::function<void(const SweepProgress&)>;

// Runs every cell of the grid that the file does not hold yet, in grid order. Returns the number run.
int64_t run_sweep(SweepEngine& e, const SweepSpec& spec, const SweepOptions& opt, SweepFile& file,
                  const SweepProgressSink& progress = {});

}  // namespace kvtier::eval
