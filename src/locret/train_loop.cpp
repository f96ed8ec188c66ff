#include "locret/train_loop.h"

#include <chrono>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kvtier::locret {
namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

int64_t sample_for_step(int64_t n_samples, uint64_t seed, int64_t step) {
  KVTIER_ASSERT(n_samples > 0 && step >= 0);
  const int64_t epoch = step / n_samples;
  const int64_t i = step % n_samples;
  // Fisher-Yates shuffle of the epoch, keyed by (seed, epoch); O(n) per call is cheap next to a
  // backbone forward pass.
  std::vector<int64_t> perm(static_cast<size_t>(n_samples));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  uint64_t key = mix64(seed ^ mix64(static_cast<uint64_t>(epoch) + 0x5bd1e995ull));
  for (int64_t k = n_samples - 1; k > 0; --k) {
    key = mix64(key);
    const auto r = static_cast<int64_t>(key % static_cast<uint64_t>(k + 1));
    std::swap(perm[static_cast<size_t>(k)], perm[static_cast<size_t>(r)]);
  }
  return perm[static_cast<size_t>(i)];
}

EvalStats evaluate(LocretTrainer& trainer, const std::vector<Sample>& held_out) {
  EvalStats e;
  if (held_out.empty()) return e;
  int64_t hits = 0, total = 0, rhits = 0, rtotal = 0, cells = 0;
  for (const Sample& s : held_out) {
    const SampleStats st = trainer.run(s, false);
    e.loss += st.loss;
    e.reg += st.reg;
    hits += st.overlap.hits;
    total += st.overlap.total;
    rhits += st.recency.hits;
    rtotal += st.recency.total;
    e.label_mean += st.label_mean;
    e.label_std += st.label_std;
    cells += st.label_cells;
    e.finite = e.finite && st.finite;
  }
  e.loss /= static_cast<double>(held_out.size());
  e.reg /= static_cast<double>(held_out.size());
  e.acc = total > 0 ? static_cast<double>(hits) / static_cast<double>(total) : 0.0;
  e.recency_acc = rtotal > 0 ? static_cast<double>(rhits) / static_cast<double>(rtotal) : 0.0;
  if (cells > 0) {
    e.label_mean /= static_cast<double>(cells);
    e.label_std /= static_cast<double>(cells);
  }
  return e;
}

TrainResult train_loop(LocretTrainer& trainer, RetainingHeads& heads, OptimizerState& state,
                       const std::vector<Sample>& train, const std::vector<Sample>& held_out,
                       const TrainLoopOptions& o, const HeadFileMeta& meta,
                       const std::function<void(const StepReport&)>& progress) {
  if (train.empty()) fail(ErrorKind::kInvalidArgument, "no training samples");
  if (o.checkpoint_every > 0 && o.checkpoint_path.empty())
    fail(ErrorKind::kInvalidArgument, "checkpoints need a path");
  TrainResult r;
  if (!held_out.empty()) {
    r.first_eval = evaluate(trainer, held_out);
    if (progress) {
      StepReport rep;
      rep.initial = true;
      rep.step = state.step;
      rep.eval = r.first_eval;
      progress(rep);
    }
  }
  while (state.step < o.steps) {
    if (o.stop && o.stop()) {
      r.stopped = true;
      break;
    }
    StepReport rep;
    rep.lr = trainer.options().schedule.lr(state.step);
    const Sample& s =
        train[static_cast<size_t>(sample_for_step(static_cast<int64_t>(train.size()), o.seed, state.step))];
    const auto t0 = std::chrono::steady_clock::now();
    rep.sample = trainer.run(s, true);
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rep.step = state.step;
    if (!rep.sample.finite)
      fail(ErrorKind::kInternal, "the training loss is not finite at step {}", rep.step);
    const bool last = state.step == o.steps;
    if (!held_out.empty() && (last || (o.eval_every > 0 && state.step % o.eval_every == 0))) {
      rep.eval = evaluate(trainer, held_out);
      if (last) r.last_eval = rep.eval;
    }
    if (o.checkpoint_every > 0 && (last || state.step % o.checkpoint_every == 0)) {
      save_heads(o.checkpoint_path, heads, meta, &state);
      rep.checkpointed = true;
    }
    if (progress) progress(rep);
  }
  if (r.stopped && o.checkpoint_every > 0) save_heads(o.checkpoint_path, heads, meta, &state);
  return r;
}

}  // namespace kvtier::locret
