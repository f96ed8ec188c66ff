#include "runtime/skew_sample.h"

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/content_hash.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/make_kv_cache.h"
#include "kv/recording_kv.h"
#include "runtime/session.h"
#include "skew/skew_math.h"

namespace kvtier::runtime {

namespace {

// Appends each pass's rows to the per-(layer, KV head) sample buffers.
class SampleStore final : public kv::KvObserver {
 public:
  explicit SampleStore(const model::ModelConfig& cfg)
      : cfg_(cfg), layers_(cfg.n_layer), inputs_(cfg.n_layer) {
    for (uint32_t l = 0; l < cfg.n_layer; ++l) {
      LayerSamples& s = layers_[l];
      s.n_head_kv = cfg.layers[l].n_head_kv;
      s.group = cfg.n_head / s.n_head_kv;
      s.q.resize(s.n_head_kv);
      s.k.resize(s.n_head_kv);
    }
  }
  void on_write(uint32_t layer, const kv::LayerRows& rows, int64_t n) override {
    LayerSamples& s = layers_[layer];
    const int64_t d = cfg_.head_dim_k;
    for (int64_t t = 0; t < n; ++t)
      for (uint32_t g = 0; g < s.n_head_kv; ++g) {
        const float* row = rows.k + (t * s.n_head_kv + g) * d;
        s.k[g].insert(s.k[g].end(), row, row + d);
      }
    if (rows.x != nullptr) inputs_[layer].insert(inputs_[layer].end(), rows.x, rows.x + n * cfg_.n_embd);
    s.n += n;
  }
  void on_queries(uint32_t layer, const float* q, int64_t n, int64_t n_head) override {
    LayerSamples& s = layers_[layer];
    const int64_t d = cfg_.head_dim_k;
    KVTIER_ASSERT(n_head == static_cast<int64_t>(cfg_.n_head));
    add_queries(s, q, n, n_head, d, s.q);
  }
  // Queries of `layer` in LayerSamples' layout from rows q: [n, n_head, d] into dst[n_head_kv].
  static void add_queries(const LayerSamples& s, const float* q, int64_t n, int64_t n_head, int64_t d,
                          std::vector<std::vector<float>>& dst) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < n_head; ++h) {
        const float* row = q + (t * n_head + h) * d;
        auto& out = dst[static_cast<size_t>(h / s.group)];
        out.insert(out.end(), row, row + d);
      }
  }
  // The look-ahead queries of layers >= 1 through the model's hook, from the recorded inputs.
  void project_lookahead(kv::KvCompute& compute, int64_t max_rows) {
    const int64_t d = cfg_.head_dim_k, H = cfg_.n_head, E = cfg_.n_embd;
    std::vector<float> q(static_cast<size_t>(max_rows * H * d));
    std::vector<int64_t> pos;
    for (uint32_t l = 1; l < cfg_.n_layer; ++l) {
      LayerSamples& s = layers_[l];
      s.q_ahead.assign(s.n_head_kv, {});
      const std::vector<float>& x = inputs_[l - 1];
      KVTIER_ASSERT(x.size() == static_cast<size_t>(s.n * E), "layer {} inputs not recorded", l - 1);
      for (int64_t t0 = 0; t0 < s.n; t0 += max_rows) {
        const int64_t m = std::min(max_rows, s.n - t0);
        pos.resize(static_cast<size_t>(m));
        for (int64_t t = 0; t < m; ++t) pos[static_cast<size_t>(t)] = t0 + t;
        compute.project_q(l, x.data() + t0 * E, pos, q.data());
        add_queries(s, q.data(), m, H, d, s.q_ahead);
      }
    }
    inputs_.clear();
  }
  std::vector<LayerSamples> take() { return std::move(layers_); }

 private:
  const model::ModelConfig& cfg_;
  std::vector<LayerSamples> layers_;
  std::vector<std::vector<float>> inputs_;  // [layer][n, E] f32: the layer inputs (lookahead)
};

// max |Q K^T - Q~ K~^T| over max |Q K^T| for the first m rows of q ([rows_q, d]) and k ([rows_k, d]).
double a1_error(const float* q, int64_t rows_q, const float* k, int64_t rows_k, const float* a, int64_t d) {
  std::vector<float> qt(static_cast<size_t>(rows_q * d)), kt(static_cast<size_t>(rows_k * d));
  skew::rotate_rows(q, rows_q, d, a, qt.data());
  skew::rotate_rows(k, rows_k, d, a, kt.data());
  double worst = 0.0, top = 0.0;
  for (int64_t i = 0; i < rows_q; ++i)
    for (int64_t j = 0; j < rows_k; ++j) {
      double s0 = 0.0, s1 = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        s0 += static_cast<double>(q[i * d + c]) * k[j * d + c];
        s1 += static_cast<double>(qt[static_cast<size_t>(i * d + c)]) * kt[static_cast<size_t>(j * d + c)];
      }
      worst = std::max(worst, std::abs(s0 - s1));
      top = std::max(top, std::abs(s0));
    }
  return top > 0.0 ? worst / top : worst;
}

double top_share(const std::vector<double>& score, int64_t k) {
  const std::vector<int32_t> top = skew::top_columns(score, k);
  double in = 0.0;
  for (const int32_t c : top) in += score[static_cast<size_t>(c)];
  const double all = std::accumulate(score.begin(), score.end(), 0.0);
  return all > 0.0 ? in / all : 0.0;
}

}  // namespace

std::vector<LayerSamples> collect_samples(const LoadedModel& model, std::span<const model::TokenId> tokens,
                                          const SkewOptions& opt, const SkewProgress& progress) {
  const model::ModelConfig& cfg = model.config;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 1) fail(ErrorKind::kInvalidArgument, "the skew sample has no tokens");
  if (cfg.n_ctx_train > 0 && n > cfg.n_ctx_train)
    fail(ErrorKind::kInvalidArgument, "a skew sample of {} tokens exceeds the model's context of {}", n,
         cfg.n_ctx_train);
  const int64_t chunk = std::min(opt.chunk > 0 ? opt.chunk : default_chunk(cfg), n);
  const cpu::Isa isa = opt.isa.value_or(cpu::best_isa());
  ThreadPool pool(std::max(opt.threads, 1));
  kv::MemoryLedger ledger;
  kv::KvOptions kvo;  // resident, every position, f32 rows (the samples do not depend on it)
  kvo.max_new_rows = chunk;
  const int64_t capacity = (n + 255) / 256 * 256;
  auto inner = kv::make_kv_cache(kvo, model::kv_geometry(cfg, 256, cpu::KvDtype::kF32), capacity, cfg.n_head,
                                 ledger, pool, isa);
  SampleStore store(cfg);
  kv::RecordingKv rec(*inner, store, opt.lookahead ? kv::kNeedLayerInput : kv::kNeedNone);
  model::Forward fwd(cfg, model.weights, chunk, pool, isa, ledger, rec.needs());
  rec.set_compute(&fwd);
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    fwd.run(tokens.subspan(static_cast<size_t>(i), static_cast<size_t>(m)), 0, rec, model::LogitRows::kNone,
            nullptr);
    if (progress) progress(SkewStage::kForward, i + m, n);
  }
  if (opt.lookahead) store.project_lookahead(fwd, fwd.max_rows());
  return store.take();
}

skew::SkewSet compute_skew(const LoadedModel& model, const std::vector<LayerSamples>& samples,
                           double partial_ratio, const SkewProgress& progress) {
  const model::ModelConfig& cfg = model.config;
  const int64_t d = cfg.head_dim_k;
  KVTIER_ASSERT(samples.size() == cfg.n_layer);
  skew::SkewSet set;
  set.head_dim = static_cast<uint32_t>(d);
  set.partial_ratio = static_cast<float>(partial_ratio);
  const int64_t k_cols = skew::partial_columns(partial_ratio, d);
  set.partial_columns = static_cast<uint32_t>(k_cols);
  set.sample_tokens = static_cast<uint32_t>(samples.front().n);
  set.layers.resize(samples.size());
  for (size_t l = 0; l < samples.size(); ++l) {
    const LayerSamples& s = samples[l];
    skew::LayerSkew& L = set.layers[l];
    L.n_head_kv = s.n_head_kv;
    for (uint32_t g = 0; g < s.n_head_kv; ++g) {
      const int64_t rows_q = s.n * s.group;
      KVTIER_ASSERT(s.q[g].size() == static_cast<size_t>(rows_q * d) &&
                    s.k[g].size() == static_cast<size_t>(s.n * d));
      const skew::SkewMatrix a = skew::skew_matrix(s.q[g], rows_q, d);
      L.a.insert(L.a.end(), a.a.begin(), a.a.end());
      L.sigma.insert(L.sigma.end(), a.sigma.begin(), a.sigma.end());
      // Offline columns (§5.1's score on the sample): sum |Q~| over the group's heads + sum |K~|.
      std::vector<float> rot(static_cast<size_t>(rows_q * d));
      std::vector<double> score(static_cast<size_t>(d), 0.0);
      skew::rotate_rows(s.q[g].data(), rows_q, d, a.a.data(), rot.data());
      skew::add_abs_column_sums(rot.data(), rows_q, d, score.data());
      skew::rotate_rows(s.k[g].data(), s.n, d, a.a.data(), rot.data());
      skew::add_abs_column_sums(rot.data(), s.n, d, score.data());
      const std::vector<int32_t> cols = skew::top_columns(score, k_cols);
      L.cols.insert(L.cols.end(), cols.begin(), cols.end());
    }
    if (progress)
      progress(SkewStage::kMatrices, static_cast<int64_t>(l + 1), static_cast<int64_t>(samples.size()));
  }
  return set;
}

skew::SkewSet load_skew_for(const LoadedModel& model, const std::string& path) {
  skew::SkewSet set = skew::read_skew(path, file_xxh3_tag(model.file->path()));
  const model::ModelConfig& cfg = model.config;
  if (set.layers.size() != cfg.n_layer || set.head_dim != cfg.head_dim_k)
    fail(ErrorKind::kInvalidFile, "{}: {} layers of head size {}, the model has {} of {}", path,
         set.layers.size(), set.head_dim, cfg.n_layer, cfg.head_dim_k);
  for (uint32_t l = 0; l < cfg.n_layer; ++l)
    if (set.layers[l].n_head_kv != cfg.layers[l].n_head_kv)
      fail(ErrorKind::kInvalidFile, "{}: layer {} has {} KV heads, the model {}", path, l,
           set.layers[l].n_head_kv, cfg.layers[l].n_head_kv);
  return set;
}

std::string infinigen_skew_path(const LoadedModel& model, const std::string& path) {
  return infinigen_skew_path(model.file->path(), path);
}

std::string infinigen_skew_path(const std::string& model_path, const std::string& path) {
  if (!path.empty()) return path;
  std::string p = model_path;
  constexpr std::string_view kExt = ".gguf";
  if (p.size() >= kExt.size() && p.compare(p.size() - kExt.size(), kExt.size(), kExt) == 0)
    p.resize(p.size() - kExt.size());
  return p + ".skew.gguf";
}

skew::SkewSet load_infinigen_skew(const LoadedModel& model, const std::string& path) {
  const std::string file = infinigen_skew_path(model, path);
  const std::string make = fmt::format("kvtier skew -m {} -o {}", model.file->path(), file);
  if (!std::filesystem::exists(file)) {
    fail(ErrorKind::kInvalidArgument,
         "selection infinigen needs the model's skew file, and {} does not exist{}; make it once with\n  {}\n"
         "(then pass --skew {} if it is not the default path)",
         file,
         path.empty() ? " (the default: the model's path with .skew.gguf; --skew FILE names another)" : "",
         make, file);
  }
  try {
    return load_skew_for(model, file);
  } catch (const Error& e) {
    fail(e.kind(), "{}\nmake the skew file for this model with\n  {}", e.what(), make);
  }
}

std::vector<LayerCheck> check_skew(const skew::SkewSet& set, const std::vector<LayerSamples>& held_out,
                                   int64_t max_rows) {
  KVTIER_ASSERT(set.layers.size() == held_out.size());
  const int64_t d = set.head_dim;
  const int64_t k_cols = set.partial_columns;
  std::vector<LayerCheck> out(held_out.size());
  for (size_t l = 0; l < held_out.size(); ++l) {
    const LayerSamples& s = held_out[l];
    const skew::LayerSkew& L = set.layers[l];
    KVTIER_ASSERT(L.n_head_kv == s.n_head_kv);
    std::vector<double> plain(static_cast<size_t>(d), 0.0), skewed(static_cast<size_t>(d), 0.0);
    std::vector<double> q_plain(static_cast<size_t>(d), 0.0), q_skewed(static_cast<size_t>(d), 0.0);
    std::vector<double> e_plain(static_cast<size_t>(d), 0.0), e_skewed(static_cast<size_t>(d), 0.0);
    auto add_squares = [d](const float* x, int64_t n, std::vector<double>& e) {
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < d; ++c)
          e[static_cast<size_t>(c)] += static_cast<double>(x[r * d + c]) * x[r * d + c];
    };
    const int64_t m = std::min(s.n, max_rows);
    for (uint32_t g = 0; g < s.n_head_kv; ++g) {
      const float* a = L.head_a(g, d);
      const int64_t rows_q = s.n * s.group;
      out[l].a1_error =
          std::max(out[l].a1_error, a1_error(s.q[g].data(), m * s.group, s.k[g].data(), m, a, d));
      std::vector<float> rot(static_cast<size_t>(rows_q * d));
      skew::add_abs_column_sums(s.q[g].data(), rows_q, d, q_plain.data());
      skew::add_abs_column_sums(s.k[g].data(), s.n, d, plain.data());
      skew::rotate_rows(s.q[g].data(), rows_q, d, a, rot.data());
      skew::add_abs_column_sums(rot.data(), rows_q, d, q_skewed.data());
      add_squares(s.q[g].data(), rows_q, e_plain);
      add_squares(rot.data(), rows_q, e_skewed);
      skew::rotate_rows(s.k[g].data(), s.n, d, a, rot.data());
      skew::add_abs_column_sums(rot.data(), s.n, d, skewed.data());
    }
    out[l].q_share_plain = top_share(q_plain, k_cols);
    out[l].q_share_skewed = top_share(q_skewed, k_cols);
    out[l].q_energy_plain = top_share(e_plain, k_cols);
    out[l].q_energy_skewed = top_share(e_skewed, k_cols);
    for (int64_t c = 0; c < d; ++c) {
      plain[static_cast<size_t>(c)] += q_plain[static_cast<size_t>(c)];
      skewed[static_cast<size_t>(c)] += q_skewed[static_cast<size_t>(c)];
    }
    out[l].share_plain = top_share(plain, k_cols);
    out[l].share_skewed = top_share(skewed, k_cols);
  }
  return out;
}

}  // namespace kvtier::runtime
