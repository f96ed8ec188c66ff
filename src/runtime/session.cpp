#include "runtime/session.h"

#include <algorithm>

#include "core/error.h"
#include "kv/footprint.h"
#include "kv/infinigen_emulation.h"
#include "kv/make_kv_cache.h"
#include "policy/kv_policy.h"
#include "runtime/profile_cache.h"
#include "runtime/skew_sample.h"
#include "runtime/token_edges.h"

namespace kvtier::runtime {

namespace {
constexpr uint64_t kLogitsBytes = uint64_t{64} << 20;  // all-position logits buffer of evaluate()
}

int64_t default_chunk(const model::ModelConfig& cfg) {
  // Bytes per token of the activations (see Forward); logits have their own buffer.
  const uint64_t per_token = 4 * (3 * uint64_t{cfg.n_embd} + 2 * uint64_t{cfg.n_ff} +
                                  uint64_t{cfg.n_head} * (cfg.head_dim_k + cfg.head_dim_v));
  const uint64_t target = uint64_t{64} << 20;
  return std::clamp<int64_t>(static_cast<int64_t>(target / per_token), 16, 512);
}

SessionOptions resolve_session_options(const model::ModelConfig& cfg, SessionOptions opt) {
  if (opt.chunk <= 0) fail(ErrorKind::kInvalidArgument, "--chunk must be positive (got {})", opt.chunk);
  if (opt.n_ctx <= 0) opt.n_ctx = cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 4096;
  if (opt.threads < 1) fail(ErrorKind::kInvalidArgument, "--threads must be at least 1");
  opt.chunk = std::min(opt.chunk, opt.n_ctx);
  opt.kv_placement.max_new_rows = opt.chunk;
  if (opt.kv_placement.max_seqs < 1) fail(ErrorKind::kInvalidArgument, "a session of 0 sequences");
  if (opt.infinigen_emulation) {
    const kv::KvOptions& k = opt.kv_placement;
    if (k.selection != policy::Selection::kInfinigen) {
      fail(ErrorKind::kInvalidArgument,
           "--infinigen-emulate emulates the selection infinigen: use it with --kv-policy infinigen "
           "(or another policy with +infinigen)");
    }
    if (k.retention == policy::Retention::kPool)
      fail(ErrorKind::kInvalidArgument, "--infinigen-emulate does not model the bounded pool (drop +pool)");
    if (k.max_seqs != 1)
      fail(ErrorKind::kInvalidArgument, "--infinigen-emulate runs one sequence (not --max-seqs {})",
           k.max_seqs);
  }
  if (opt.infinigen_emulate_from != 0 && !opt.infinigen_emulation)
    fail(ErrorKind::kInvalidArgument, "--infinigen-emulate-from needs --infinigen-emulate");
  if (opt.infinigen_emulate_from < 0 || opt.infinigen_emulate_from >= opt.n_ctx) {
    fail(ErrorKind::kInvalidArgument, "--infinigen-emulate-from {} is outside the context (0 .. {})",
         opt.infinigen_emulate_from, opt.n_ctx - 1);
  }
  return opt;
}

namespace {

// The options of the cache a session builds: the placement's, or under the emulation its inner resident one.
kv::KvOptions cache_options(const SessionOptions& o) {
  if (!o.infinigen_emulation) return o.kv_placement;
  // The emulation's rows live in a resident cache that attends densely (kv/infinigen_emulation.h).
  kv::KvOptions k = o.kv_placement;
  k.placement = policy::PlacementConfig{};
  k.selection = policy::Selection::kAll;
  k.disk_dir.clear();
  return k;
}

// The rows the model hands the session's cache (the emulation's look-ahead needs the layer inputs).
uint32_t session_kv_needs(const SessionOptions& o) {
  return kv::kv_needs(cache_options(o)) | (o.infinigen_emulation ? kv::kNeedLayerInput : kv::kNeedNone);
}

// Tokens per pass of evaluate(): its logits buffer holds that many rows.
int64_t logit_rows(const model::ModelConfig& cfg, int64_t chunk) {
  return std::clamp<int64_t>(static_cast<int64_t>(kLogitsBytes / (4 * uint64_t{cfg.n_vocab})), 1, chunk);
}

}  // namespace

kv::KvGeometry kv_geometry(const LoadedModel& model, const SessionOptions& o) {
  kv::KvGeometry g = model::kv_geometry(model.config, o.kv_block_tokens, o.kv_dtype);
  g.act_row_bytes = model::kv_input_row_bytes(model.config, model.weights);
  return g;
}

kv::MemoryLedger predict_memory(const LoadedModel& model, const SessionOptions& options) {
  const auto& cfg = model.config;
  // infinigen: a session predicts with its skew file's column count (kv_placement.skew); a planner
  // without one gets floor(0.3 · head_dim) columns (kv::tiered_layout).
  const SessionOptions o = resolve_session_options(cfg, options);
  kv::MemoryLedger p;
  p.set_budget(kv::Tier::kHost, o.host_mem);  // a --host-mem that cannot hold the KV fails as in a run
  const model::WeightFootprint wf = model::weight_footprint(*model.file, model.weights, o.weights);
  p.reserve(kv::Tier::kDevice, kv::Category::kWeights, wf.device_bytes);
  p.reserve(kv::Tier::kHost, kv::Category::kWeights, wf.host_bytes);
  p.reserve(kv::Tier::kDisk, kv::Category::kWeights, wf.disk_bytes);
  p.reserve(kv::Tier::kDevice, kv::Category::kActivations,
            model::forward_buffers(cfg, model.weights, o.chunk, session_kv_needs(o)).bytes());
  const kv::KvFootprint f =
      kv::kv_footprint(cache_options(o), kv_geometry(model, o), o.n_ctx, cfg.n_head, o.threads);
  p.reserve(kv::Tier::kDevice, kv::Category::kKv, f.device_kv);
  p.reserve(kv::Tier::kDevice, kv::Category::kStaging, f.device_staging);
  p.reserve(kv::Tier::kDevice, kv::Category::kScratch, f.device_scratch);
  p.reserve(kv::Tier::kHost, kv::Category::kKv, f.host_kv);
  p.reserve(kv::Tier::kDisk, kv::Category::kKv, f.disk_kv);
  p.reserve(kv::Tier::kDevice, kv::Category::kLogits,
            static_cast<uint64_t>(logit_rows(cfg, o.chunk)) * cfg.n_vocab * 4);
  return p;
}

Session::Session(const LoadedModel& model, const SessionOptions& opt)
    : model_(model),
      opt_(resolve_session_options(model.config, opt)),
      isa_(opt.isa.value_or(cpu::best_isa())),
      pool_(opt_.threads) {
  const auto& cfg = model.config;
  cpu::require_isa(isa_);
  ledger_.set_budget(kv::Tier::kHost, opt_.host_mem);
  weights_ = std::make_unique<model::WeightStreamer>(*model.file, model.weights, opt_.weights, ledger_);
  kv::KvOptions& ko = opt_.kv_placement;
  const bool hybrid_auto = ko.representation == policy::Representation::kHybrid &&
                           ko.knobs.act_ratio == policy::PolicyKnobs::kActRatioAuto;
  if (weights_->streams()) {  // hybrid auto: Algorithm 1's T_w, one streamed layer's load
    const model::WeightStreamStats ws = weights_->stats();
    ko.weight_load_s =
        opt_.weights.link_bytes_per_s > 0
            ? static_cast<double>(ws.streamed_bytes) / ws.streamed_layers / opt_.weights.link_bytes_per_s
            : 0;
  }
  if (((policy::recomputes_prefix(ko.representation) && ko.knobs.recompute < 0) || hybrid_auto) &&
      ko.placement.placement != policy::Placement::kResident &&
      (ko.kvpr_link_bytes_per_s <= 0 || ko.kvpr_tokens_per_s <= 0)) {
    // --recompute auto: the scheduler weighs the home link against the projection rate, profiled
    // once per model and machine (and link throttle, disk directory).
    ProfileOptions po;
    po.threads = opt_.threads;
    po.isa = isa_;
    po.disk_dir = ko.disk_dir;
    po.link_bytes_per_s = ko.link_bytes_per_s;
    const Profile p = opt_.profile_cache.empty() ? measure_profile(model, po)
                                                 : get_profile(opt_.profile_cache, model, po).profile;
    ko.kvpr_link_bytes_per_s = kvpr_costs(p, !ko.disk_dir.empty()).v_com_kv;
    ko.kvpr_tokens_per_s = p.proj_tokens_per_s;
    ko.kvpr_decode_weights_s = p.decode_weights_s;
  }
  if (ko.retention == policy::Retention::kLocret && ko.knobs.locret_span != policy::LocretSpan::kToken &&
      !ko.token_edges)
    ko.token_edges = std::make_shared<const std::vector<uint8_t>>(token_edges(*model.tokenizer));
  if (ko.selection == policy::Selection::kInfinigen && !ko.skew)
    ko.skew = std::make_shared<const skew::SkewSet>(load_infinigen_skew(model, opt_.skew_path));
  kv_ = kv::make_kv_cache(cache_options(opt_), kv_geometry(model, opt_), opt_.n_ctx, cfg.n_head, ledger_,
                          pool_, isa_);
  if (opt_.infinigen_emulation) {
    kv::InfinigenEmulationOptions eo;
    eo.params.alpha = static_cast<float>(ko.knobs.infinigen_alpha);
    eo.params.budget = ko.knobs.infinigen_budget;
    eo.params.group = ko.knobs.infinigen_group;
    eo.emulate_from = opt_.infinigen_emulate_from;  // 0: every query a decode step, offline columns
    eo.n_head = cfg.n_head;
    eo.n_embd = cfg.n_embd;
    eo.isa = isa_;
    emulation_ = std::make_unique<kv::InfinigenEmulationKv>(*kv_, *ko.skew, eo, pool_);
  }
  KVTIER_ASSERT(kv().needs() == session_kv_needs(opt_));
  forward_ =
      std::make_unique<model::Forward>(cfg, model.weights, opt_.chunk, pool_, isa_, ledger_, kv().needs());
  forward_->set_weight_stream(weights_.get());
  kv().set_compute(forward_.get());
  // evaluate() needs every position's logits: it runs passes of at most logit_rows_ tokens.
  logit_rows_ = logit_rows(cfg, opt_.chunk);
  const uint64_t n_logits = static_cast<uint64_t>(logit_rows_) * cfg.n_vocab;
  logits_reservation_ = kv::Reservation(ledger_, kv::Tier::kDevice, kv::Category::kLogits, n_logits * 4);
  logits_ = std::make_unique_for_overwrite<float[]>(n_logits);
  // Planners rely on this: what the session holds is what predict_memory says.
  const kv::MemoryLedger predicted = predict_memory(model, opt_);
  for (int t = 0; t < kv::kNumTiers; ++t) {
    for (int c = 0; c < kv::kNumCategories; ++c) {
      const auto tier = static_cast<kv::Tier>(t);
      const auto cat = static_cast<kv::Category>(c);
      KVTIER_ASSERT(ledger_.current(tier, cat) == predicted.current(tier, cat),
                    "{} {}: {} bytes held, {} predicted", kv::tier_name(tier), kv::category_name(cat),
                    ledger_.current(tier, cat), predicted.current(tier, cat));
    }
  }
}

std::span<const float> Session::prefill(kv::SeqId seq, std::span<const TokenId> tokens,
                                        const ProgressFn& progress) {
  KVTIER_ASSERT(!tokens.empty(), "prefill of no tokens");
  const auto n = static_cast<int64_t>(tokens.size());
  // The policy's chunk schedule (chunks of --chunk unless it has its own, as locret does).
  const std::vector<int64_t> passes = kv().plan_prefill(seq, n, opt_.chunk);
  int64_t i = 0;
  for (const int64_t m : passes) {
    KVTIER_ASSERT(m > 0 && m <= opt_.chunk && i + m <= n, "prefill pass of {} tokens at {} of {}", m, i, n);
    const bool last = i + m == n;
    forward_->run(tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(m)), seq, kv(),
                  last ? model::LogitRows::kLast : model::LogitRows::kNone, logits_.get());
    if (progress) progress(i + m, n);
    i += m;
  }
  KVTIER_ASSERT(i == n, "the prefill plan covers {} of {} tokens", i, n);
  return {logits_.get(), model_.config.n_vocab};
}

std::span<const float> Session::evaluate_states(kv::SeqId seq, std::span<const TokenId> tokens,
                                                const StatesFn& fn, const ProgressFn& progress) {
  KVTIER_ASSERT(!tokens.empty(), "evaluation of no tokens");
  const auto n = static_cast<int64_t>(tokens.size());
  const size_t E = model_.config.n_embd;
  int64_t i = 0;
  for (const int64_t m : kv().plan_prefill(seq, n, opt_.chunk)) {  // prefill's own passes
    KVTIER_ASSERT(m > 0 && m <= opt_.chunk && i + m <= n, "prefill pass of {} tokens at {} of {}", m, i, n);
    const int64_t pos0 = kv().positions(seq);
    forward_->run(tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(m)), seq, kv(),
                  model::LogitRows::kStates, nullptr);
    const std::span<const float> states = forward_->states();  // [m, n_embd]
    for (int64_t t = 0; t < m; ++t) fn(pos0 + t, states.subspan(static_cast<size_t>(t) * E, E));
    if (i + m == n) forward_->output(states.data() + static_cast<size_t>(m - 1) * E, 1, logits_.get());
    if (progress) progress(i + m, n);
    i += m;
  }
  KVTIER_ASSERT(i == n, "the prefill plan covers {} of {} tokens", i, n);
  return {logits_.get(), model_.config.n_vocab};
}

bool Session::prefill_cuts_matter() const {
  const kv::KvOptions& k = opt_.kv_placement;
  policy::KvPolicy p;
  p.placement = k.placement.placement;
  p.representation = k.representation;
  p.selection = k.selection;
  p.retention = k.retention;
  return !p.exact();
}

std::span<const float> Session::decode(kv::SeqId seq, TokenId token) {
  forward_->run({&token, 1}, seq, kv(), model::LogitRows::kLast, logits_.get());
  return {logits_.get(), model_.config.n_vocab};
}

std::span<const float> Session::step(std::span<const model::SeqTokens> parts) {
  KVTIER_ASSERT(!parts.empty() && static_cast<int64_t>(parts.size()) <= max_batch(),
                "a step of {} sequences (at most {})", parts.size(), max_batch());
  int64_t n = 0;
  int64_t rows = 0;
  for (const model::SeqTokens& p : parts) {
    KVTIER_ASSERT(p.rows != model::LogitRows::kAll, "step() gives the last token's logits only");
    n += static_cast<int64_t>(p.tokens.size());
    rows += model::logit_rows(p);
  }
  KVTIER_ASSERT(n <= opt_.chunk, "a step of {} tokens (the chunk is {})", n, opt_.chunk);
  forward_->run_batch(parts, kv(), logits_.get());
  return {logits_.get(), static_cast<size_t>(rows) * model_.config.n_vocab};
}

std::span<const float> Session::evaluate(kv::SeqId seq, std::span<const TokenId> tokens, const LogitsFn& fn,
                                         const ProgressFn& progress) {
  const auto n = static_cast<int64_t>(tokens.size());
  KVTIER_ASSERT(n > 0, "evaluation of no tokens");
  int64_t last_row = 0;
  const size_t V = model_.config.n_vocab;
  int64_t i = 0;
  for (const int64_t m : kv().plan_prefill(seq, n, logit_rows_)) {  // the policy's chunk schedule
    KVTIER_ASSERT(m > 0 && m <= logit_rows_ && i + m <= n, "evaluation pass of {} tokens at {} of {}", m, i,
                  n);
    const int64_t pos0 = kv().positions(seq);
    forward_->run(tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(m)), seq, kv(),
                  model::LogitRows::kAll, logits_.get());
    for (int64_t t = 0; t < m; ++t) fn(pos0 + t, {logits_.get() + static_cast<size_t>(t) * V, V});
    last_row = m - 1;
    if (progress) progress(i + m, n);
    i += m;
  }
  KVTIER_ASSERT(i == n, "the evaluation plan covers {} of {} tokens", i, n);
  return {logits_.get() + static_cast<size_t>(last_row) * V, V};
}

void Session::truncate(kv::SeqId seq, int64_t n) {
  kv().truncate(seq, n);
}

std::optional<kv::TieredStats> Session::kv_stats() const {
  if (const auto* t = dynamic_cast<const kv::TieredKv*>(kv_.get())) return t->stats();
  return std::nullopt;
}

}  // namespace kvtier::runtime
