#include "locret/trainer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "locret/labels.h"

namespace kvtier::locret {
namespace {

size_t sz(int64_t n) {
  return static_cast<size_t>(n);
}

}  // namespace

LocretTrainer::LocretTrainer(const model::ModelConfig& cfg, const model::ModelWeights& w, ThreadPool& pool,
                             cpu::Isa isa, RetainingHeads& heads, OptimizerState& state,
                             TrainerOptions options)
    : cfg_(cfg), pool_(pool), isa_(isa), heads_(heads), state_(state), opt_(options) {
  if (opt_.max_tokens < 2) fail(ErrorKind::kInvalidArgument, "training samples need at least 2 tokens");
  if (opt_.max_len < 1) fail(ErrorKind::kInvalidArgument, "the trained prompt length must be positive");
  if (heads_.n_layer() != cfg.n_layer)
    fail(ErrorKind::kInvalidArgument, "retaining heads of {} layers for a model of {}", heads_.n_layer(),
         cfg.n_layer);
  KVTIER_ASSERT(state_.m.size() == heads_.n_layer() && state_.v.size() == heads_.n_layer());
  const kv::KvGeometry geo = model::kv_geometry(cfg, 256, opt_.kv_dtype);
  kv_ = std::make_unique<kv::ResidentKv>(geo, opt_.max_tokens, cfg.n_head, ledger_, pool_, isa_);
  capture_ = std::make_unique<CaptureKv>(*kv_, static_cast<LayerObserver&>(*this));
  forward_ =
      std::make_unique<model::Forward>(cfg, w, opt_.max_tokens, pool_, isa_, ledger_, capture_->needs());
  capture_->set_compute(forward_.get());
}

LocretTrainer::~LocretTrainer() = default;

SampleStats LocretTrainer::run(const Sample& sample, bool update) {
  const auto n = static_cast<int64_t>(sample.tokens.size());
  if (sample.n_prompt < 1 || sample.n_prompt >= n)
    fail(ErrorKind::kInvalidArgument,
         "a training sample needs a prompt and an answer ({} prompt of {} tokens)", sample.n_prompt, n);
  if (n > opt_.max_tokens)
    fail(ErrorKind::kInvalidArgument, "a training sample of {} tokens; the trainer was sized for {}", n,
         opt_.max_tokens);
  sample_ = &sample;
  update_ = update;
  stats_ = {};
  stats_.n_trained = std::min(sample.n_prompt, opt_.max_len);
  try {
    forward_->run(sample.tokens, 0, *capture_, model::LogitRows::kNone, nullptr);
  } catch (...) {
    sample_ = nullptr;
    throw;
  }
  kv_->truncate(0, 0);
  sample_ = nullptr;
  if (update) ++state_.step;
  return stats_;
}

void LocretTrainer::on_layer(const LayerCapture& c) {
  KVTIER_ASSERT(sample_ != nullptr && c.pos0 == 0, "a capture outside a training sample");
  const uint32_t l = c.layer;
  const LayerShape& s = heads_.shapes().layers[l];
  const int64_t dm = heads_.shapes().d_m;
  const int64_t hk = s.n_head_kv;
  const int64_t nq = sample_->n_prompt;
  const int64_t T = stats_.n_trained;
  x_.resize(sz(T * s.d_in()));
  z_.resize(sz(T * dm));
  a_.resize(sz(T * dm));
  p_.resize(sz(T * hk));
  dp_.resize(sz(T * hk));
  y_full_.resize(sz(hk * nq));
  y_.resize(sz(hk * T));

  LabelInputs li;
  li.q_answer = c.q + nq * s.q_dim();
  li.k_prompt = c.k;
  li.n_answer = c.n - nq;
  li.n_prompt = nq;
  li.n_head = s.n_head;
  li.n_head_kv = hk;
  li.head_dim = s.head_dim_k;
  li.scale = c.attention.scale;
  li.softcap = c.attention.softcap;
  cis_labels(li, y_full_.data());
  for (int64_t j = 0; j < hk; ++j) std::copy_n(y_full_.data() + j * nq, T, y_.data() + j * T);
  label_diagnostics(T, hk);
  if (opt_.labels == LabelTarget::kCentered) {
    for (int64_t j = 0; j < hk; ++j) {
      float* y = y_.data() + j * T;
      double mean = 0.0;
      for (int64_t t = 0; t < T; ++t) mean += y[t];
      mean /= static_cast<double>(T);
      for (int64_t t = 0; t < T; ++t) y[t] = static_cast<float>(y[t] - mean);
    }
  }

  const Compute comp{&pool_, isa_};
  assemble_features(s, c.q_pre, c.k_pre, c.v, T, x_.data());
  head_forward(comp, s, dm, heads_.shapes().act, heads_.layer(l), x_.data(), T, z_.data(), a_.data(),
               p_.data());
  const LayerLoss ll = layer_loss<float>(p_.data(), y_.data(), T, hk, heads_.n_layer(), opt_.loss,
                                         update_ ? dp_.data() : nullptr);
  stats_.loss += ll.total;
  stats_.reg += ll.reg;
  stats_.smooth += ll.smooth;
  stats_.finite = stats_.finite && std::isfinite(ll.total);
  const Overlap o = topk_overlap(p_.data(), y_.data(), T, hk);
  stats_.overlap.hits += o.hits;
  stats_.overlap.total += o.total;
  if (!update_) return;
  head_backward(comp, s, dm, heads_.shapes().act, heads_.layer(l), x_.data(), T, z_.data(), a_.data(),
                dp_.data(), grad_, backward_);
  optimizer_step_layer(heads_.layer(l), grad_, state_.m[l], state_.v[l], state_.step, opt_.schedule,
                       opt_.clip, opt_.adam);
}

void LocretTrainer::label_diagnostics(int64_t T, int64_t hk) {
  pos_.resize(sz(T * hk));  // [T, h_kv]: score = position
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < hk; ++j) pos_[sz(t * hk + j)] = static_cast<float>(t);
  const Overlap r = topk_overlap(pos_.data(), y_.data(), T, hk);
  stats_.recency.hits += r.hits;
  stats_.recency.total += r.total;
  for (int64_t j = 0; j < hk; ++j) {
    double s = 0.0, s2 = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      const double y = y_[sz(j * T + t)];
      s += y;
      s2 += y * y;
    }
    const double mean = s / static_cast<double>(T);
    stats_.label_mean += mean;
    stats_.label_std += std::sqrt(std::max(0.0, s2 / static_cast<double>(T) - mean * mean));
    ++stats_.label_cells;
  }
}

}  // namespace kvtier::locret
