// The training run around LocretTrainer: which sample each step sees (a seeded shuffle per epoch, a
// pure function of (seed, step), so a resumed run sees the same samples as an uninterrupted one),
// held-out evaluation, progress reports and atomic checkpoints (heads + AdamW state + step through
// save_heads: a temporary file renamed into place).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "locret/head_file.h"
#include "locret/trainer.h"

namespace kvtier::locret {

// Index of the training sample of optimizer step `step` (0-based) among n_samples.
int64_t sample_for_step(int64_t n_samples, uint64_t seed, int64_t step);

struct EvalStats {
  double loss = 0.0;  // mean over samples of the loss
  double reg = 0.0;   // mean over samples of the regression term (the spec's "regression loss")
  double acc = 0.0;   // top-10% overlap over all samples, layers and KV heads
  // Label diagnostics (SampleStats): a recency predictor's overlap; the labels' mean and their
  // standard deviation within a prompt, averaged over samples, layers and KV heads.
  double recency_acc = 0.0, label_mean = 0.0, label_std = 0.0;
  bool finite = true;
};

// Runs the held-out samples without updates.
EvalStats evaluate(LocretTrainer& trainer, const std::vector<Sample>& held_out);

struct TrainLoopOptions {
  int64_t steps = 0;             // optimizer steps of the whole run (the schedule's total)
  uint64_t seed = 0;             // sample order
  int64_t eval_every = 0;        // held-out evaluation every N steps (0: at the start and the end only)
  int64_t checkpoint_every = 0;  // 0: no checkpoints
  std::string checkpoint_path;
  // Polled between steps; returns true to stop (after a checkpoint, when checkpoints are on).
  std::function<bool()> stop;
};

struct StepReport {
  bool initial = false;  // the evaluation before the run's first step (no step taken)
  int64_t step = 0;      // optimizer steps taken after this one
  double lr = 0.0;       // the rate this step used
  SampleStats sample;
  double seconds = 0.0;           // wall time of the step
  std::optional<EvalStats> eval;  // when evaluated after this step
  bool checkpointed = false;
};

struct TrainResult {
  std::optional<EvalStats> first_eval, last_eval;
  bool stopped = false;  // by options.stop
};

// Trains from state.step to options.steps. The first evaluation runs before the first step of the
// run (it is the "step 0" figure for a fresh run) and is reported with initial = true.
TrainResult train_loop(LocretTrainer& trainer, RetainingHeads& heads, OptimizerState& state,
                       const std::vector<Sample>& train, const std::vector<Sample>& held_out,
                       const TrainLoopOptions& options, const HeadFileMeta& meta,
                       const std::function<void(const StepReport&)>& progress);

}  // namespace kvtier::locret
