// The results file of `kvtier compare`: JSON lines, a header (what the sweep is: model, seed,
// samples, depths and the settings that change results) and then one line per finished cell (its
// samples, KV bytes per tier, bytes moved, prefill and decode time). A cell's line is appended with
// one write() and fsync'd, so a killed sweep loses at most the cell it was running; a run with the
// same file skips the cells it holds. An incomplete last line (a write cut short) is dropped with
// a warning and its cell runs again; any other line that does not parse is an error naming it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/results.h"
#include "eval/sweep.h"

namespace kvtier::eval {

struct SweepHeader {
  std::string model;       // path as given
  std::string model_name;  // file stem
  uint64_t seed = 0;
  int samples = 1;
  std::vector<double> depths;
  // Settings that change results (chunk, chat template, knobs other than the budget, ...): a resumed
  // sweep must have the same.
  nlohmann::json settings = nlohmann::json::object();
  bool operator==(const SweepHeader&) const = default;
};

// Peak bytes of the KV category per tier, as the session's memory ledger measured them.
struct KvBytes {
  uint64_t device = 0, host = 0, disk = 0;
  uint64_t total() const { return device + host + disk; }
};

struct CellResult {
  CellKey key;
  std::vector<SampleResult> samples;
  KvBytes kv;
  uint64_t bytes_loaded = 0, bytes_stored = 0;  // transfers between tiers during the cell
  int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_s = 0.0, decode_s = 0.0;  // generation only (ppl windows are not timed)
  double seconds = 0.0;                    // wall time of the cell
  int threads = 0;
  std::string commit, machine, finished;  // where and when it ran
  std::string command;                    // the kvtier command that ran it
  // Mean score (ppl: perplexity over the windows).
  double value() const;
};

nlohmann::json header_json(const SweepHeader& h);
SweepHeader header_from_json(const nlohmann::json& j);
nlohmann::json cell_json(const CellResult& c);
// `depths`: the header's depth grid (gives each sample its depth index).
CellResult cell_from_json(const nlohmann::json& j, const std::vector<double>& depths);

// What a results file holds.
struct SweepRecord {
  SweepHeader header;
  std::vector<CellResult> cells;  // in file order, each key once
};
// Reads a results file; `dropped_tail` is set when an incomplete last line was found (it is not
// removed from the file here).
SweepRecord read_sweep_file(const std::string& path, bool* dropped_tail = nullptr);

// A results file open for a sweep: created with `header` if missing or empty; otherwise its header
// must equal `header` (an error names the first setting that differs) and an incomplete last line is
// cut off.
class SweepFile {
 public:
  SweepFile(std::string path, const SweepHeader& header);
  const std::vector<CellResult>& cells() const { return record_.cells; }
  bool has(const CellKey& k) const;
  // Appends the cell's line atomically (one write, then fsync).
  void append(const CellResult& c);
  bool dropped_tail() const { return dropped_tail_; }

 private:
  std::string path_;
  SweepRecord record_;
  bool dropped_tail_ = false;
};

}  // namespace kvtier::eval
