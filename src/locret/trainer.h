// One training (or evaluation) step of Locret's retaining heads on one sample (spec locret.md §3.3):
// the frozen backbone runs prompt + answer in one exact full-attention pass at true positions; at
// each layer (through CaptureKv) the trainer takes the prompt's pre-RoPE q, k, v as the heads'
// input, the answer's post-RoPE queries against the prompt's post-RoPE keys as labels, scores the
// first min(n_prompt, max_len) prompt tokens, and computes the layer's loss, gradients and AdamW
// step. The loss separates by layer (§3.3), so each layer's head is updated while its rows are at
// hand and nothing is stored across layers: memory is one layer's features, whatever the depth.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/attention.h"
#include "kv/ledger.h"
#include "kv/resident_kv.h"
#include "locret/capture_kv.h"
#include "locret/loss.h"
#include "locret/optimizer.h"
#include "locret/retaining_head.h"
#include "model/forward.h"

namespace kvtier::locret {

// A training sample: tokens = prompt (n_prompt tokens) then the reference answer (teacher-forced).
struct Sample {
  std::vector<int32_t> tokens;
  int64_t n_prompt = 0;
};

// The regression target: the reference's max logit (raw), or that minus its mean over the trained
// prompt tokens of each (layer, KV head) (centered). Eviction ranks the units of one (layer, KV head)
// against each other, so a shift shared by all of them does not change what is kept; centering takes
// the per-sample offset out of what the bias-free heads must fit (mean 10.0 over a spread of 3.5 within
// a prompt on Gemma-3-270M, whose QK-normed logits are large; -0.3 over 2.1 on SmolLM2-135M:
// docs/locret.md).
enum class LabelTarget { kRaw, kCentered };

struct TrainerOptions {
  int64_t max_tokens = 0;   // the longest sample (prompt + answer), run in one pass
  int64_t max_len = 10240;  // prompt tokens trained on (features and labels truncated alike)
  LossConfig loss;
  AdamWConfig adam;
  LinearSchedule schedule;
  double clip = 0.5;  // gradient clipping by value
  LabelTarget labels = LabelTarget::kRaw;
  cpu::KvDtype kv_dtype = cpu::KvDtype::kF16;
};

struct SampleStats {
  double loss = 0.0;    // sum over layers of the layer terms
  double reg = 0.0;     // the regression (SmoothL1) part
  double smooth = 0.0;  // sum over layers of smooth_l (before alpha)
  Overlap overlap;      // top-10% overlap of predictions and labels, all layers and KV heads
  // Diagnostics of the labels (no effect on training): the overlap a recency predictor (score =
  // position) would reach, and the labels' mean and their standard deviation over one prompt's
  // tokens, summed over layers and KV heads (divide by label_cells).
  Overlap recency;
  double label_mean = 0.0, label_std = 0.0;
  int64_t label_cells = 0;
  bool finite = true;  // no NaN or Inf in the loss
  int64_t n_trained = 0;
};

class LocretTrainer final : private LayerObserver {
 public:
  // heads and state are updated in place by run(..., update = true); all references must outlive
  // the trainer.
  LocretTrainer(const model::ModelConfig& cfg, const model::ModelWeights& w, ThreadPool& pool, cpu::Isa isa,
                RetainingHeads& heads, OptimizerState& state, TrainerOptions options);
  ~LocretTrainer() override;

  // Runs the sample; with update, takes one optimizer step (state.step advances by one).
  SampleStats run(const Sample& sample, bool update);

  const TrainerOptions& options() const { return opt_; }

 private:
  void on_layer(const LayerCapture& c) override;
  void label_diagnostics(int64_t T, int64_t hk);  // of y_: SampleStats::recency, label_mean/std

  const model::ModelConfig& cfg_;
  ThreadPool& pool_;
  cpu::Isa isa_;
  RetainingHeads& heads_;
  OptimizerState& state_;
  TrainerOptions opt_;
  kv::MemoryLedger ledger_;
  std::unique_ptr<kv::ResidentKv> kv_;
  std::unique_ptr<CaptureKv> capture_;
  std::unique_ptr<model::Forward> forward_;
  // One layer's scratch (T = trained prompt tokens):
  std::vector<float> x_;       // [T, d_in] f32
  std::vector<float> z_, a_;   // [T, d_m] f32
  std::vector<float> p_, dp_;  // [T, h_kv] f32
  std::vector<float> pos_;     // [T, h_kv] f32: the recency predictor (position)
  std::vector<float> y_full_;  // [h_kv, n_prompt] f32
  std::vector<float> y_;       // [h_kv, T] f32
  LayerParams<float> grad_;
  BackwardScratch<float> backward_;
  // The sample being run:
  const Sample* sample_ = nullptr;
  bool update_ = false;
  SampleStats stats_;
};

}  // namespace kvtier::locret
