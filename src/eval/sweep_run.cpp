#include "eval/sweep_run.h"

#include <chrono>
#include <ctime>

namespace kvtier::eval {
namespace {

using Clock = std::chrono::steady_clock;

std::string now_iso() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Relative cost of a cell for the ETA: its context length (prefill dominates) per sample.
double cost(const CellKey& k, const SweepOptions& opt) {
  const double per_cell = task_has_depth(k.task) ? static_cast<double>(opt.depths.size()) : 1.0;
  return static_cast<double>(k.length) * per_cell * opt.samples;
}

}  // namespace

int64_t run_sweep(SweepEngine& e, const SweepSpec& spec, const SweepOptions& opt, SweepFile& file,
                  const SweepProgressSink& progress) {
  const std::vector<CellKey> grid = expand_grid(spec);
  double todo_cost = 0.0;
  int64_t resumed = 0;
  for (const CellKey& k : grid) {
    if (file.has(k)) {
      ++resumed;
    } else {
      todo_cost += cost(k, opt);
    }
  }
  const auto t0 = Clock::now();
  double done_cost = 0.0;
  int64_t done = resumed, ran = 0;
  for (const CellKey& k : grid) {
    if (file.has(k)) continue;
    if (progress) {
      const double el = std::chrono::duration<double>(Clock::now() - t0).count();
      progress({done, static_cast<int64_t>(grid.size()), resumed, el,
                done_cost > 0 ? el / done_cost * (todo_cost - done_cost) : -1.0, k.label()});
    }
    const auto tc = Clock::now();
    e.configure(k);
    EvalPlan plan;
    plan.tasks = {k.task};
    plan.grid.lengths = {k.length};
    plan.grid.depths = opt.depths;
    plan.grid.samples = opt.samples;
    plan.grid.seed = opt.seed;
    plan.policies = {k.config()};
    plan.ppl_text = opt.ppl_text;
    const Results r = run_eval(e, plan);
    const CellMeasures m = e.measures();
    CellResult c;
    c.key = k;
    c.samples = r.samples();
    c.kv = m.kv;
    c.bytes_loaded = m.bytes_loaded;
    c.bytes_stored = m.bytes_stored;
    c.prefill_tokens = m.prefill_tokens;
    c.decode_tokens = m.decode_tokens;
    c.prefill_s = m.prefill_s;
    c.decode_s = m.decode_s;
    c.threads = m.threads;
    c.seconds = std::chrono::duration<double>(Clock::now() - tc).count();
    c.commit = opt.commit;
    c.machine = opt.machine;
    c.command = opt.command;
    c.finished = now_iso();
    file.append(c);
    done_cost += cost(k, opt);
    ++done;
    ++ran;
  }
  if (progress) {
    progress({done, static_cast<int64_t>(grid.size()), resumed,
              std::chrono::duration<double>(Clock::now() - t0).count(), 0.0, "done"});
  }
  return ran;
}

}  // namespace kvtier::eval
