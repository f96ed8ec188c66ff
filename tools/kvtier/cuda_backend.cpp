// cuda_backend.h on a CUDA build: the engine flags mapped onto a CudaSession.
#include "cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/cuda/device.h"
#include "backend/cuda/probe.h"
#include "backend/cuda/spec.h"
#include "cli_util.h"
#include "core/error.h"
#include "model/cuda/synth_weights.h"
#include "model/presets.h"
#include "policy/placement.h"
#include "runtime/argmax.h"
#include "runtime/cuda/cuda_session.h"
#include "runtime/skew_sample.h"
#include "skew/skew_file.h"
#include "skew/skew_math.h"
#include "tokenizer/utf8.h"

namespace kvtier::cli {
namespace {

using Clock = std::chrono::steady_clock;

void require_device() {
  if (!runtime_cuda::cuda_device_available())
    fail(ErrorKind::kUnsupported, "--backend cuda: no CUDA device on this machine (or no driver)");
}

runtime_cuda::CudaSessionOptions cuda_options(const EngineArgs& e, policy::Placement placement,
                                              int64_t ctx_needed) {
  if (!e.kv_type.empty() && e.kv_type != "f16")
    fail(ErrorKind::kUnsupported, "--backend cuda: --kv-type {} (f16 only)", e.kv_type);
  if (!e.kv_disk.empty()) fail(ErrorKind::kUnsupported, "--backend cuda: --kv-disk is not implemented yet");
  require_device();
  runtime_cuda::CudaSessionOptions o;
  o.n_ctx = e.ctx > 0 ? e.ctx : std::max<int64_t>(256, (ctx_needed + 255) / 256 * 256);
  o.chunk = e.chunk > 0 ? e.chunk : std::min<int64_t>(512, o.n_ctx);
  if (!e.device_mem.empty()) o.device_mem = parse_bytes(e.device_mem, "--device-mem");
  o.kv.placement.placement = placement;
  o.kv.placement.group = e.group;
  o.kv.placement.prefetch_depth = e.prefetch_depth;
  o.kv.placement.static_heads = e.static_heads;
  if (!e.kv_mem.empty() && placement != policy::Placement::kResident) {
    o.kv.staging_bytes = parse_bytes(e.kv_mem, "--kv-mem");
  }
  o.kv.debug_copy_delay_us = e.debug_copy_delay_us;
  o.kv.gather = e.kv_gather == "flat" ? cuda::GatherKernel::kFlat : cuda::GatherKernel::kPersistent;
  return o;
}

nlohmann::json speculation_json(const kv_cuda::DeviceKvStats& st) {
  if (st.spec_layer_steps == 0) return nullptr;
  return {{"layer_steps", st.spec_layer_steps},
          {"rows_total", st.spec_rows_total},
          {"rows_fetched", st.spec_rows_fetched},
          {"fetched_fraction",
           static_cast<double>(st.spec_rows_fetched) / static_cast<double>(st.spec_rows_total)},
          {"n_sel_mean", static_cast<double>(st.spec_n_sel_sum) / static_cast<double>(st.spec_layer_steps)},
          {"spec_ms", st.spec_ms}};
}

nlohmann::json device_json(const runtime_cuda::CudaSession& s) {
  const auto devs = cuda::list_devices();
  const cuda::MemoryReport m = s.memory_report();
  const auto st = s.kv_stats();
  return {{"device", devs.empty() ? "?" : devs.front().name},
          {"arena_budget", m.arena_budget},
          {"arena_peak", m.arena_peak},
          {"pinned_capacity", m.pinned_capacity},
          {"pinned_peak", m.pinned_peak},
          {"device_free", m.device_free},
          {"device_total", m.device_total},
          {"kv_bytes_h2d", st.bytes_h2d},
          {"kv_bytes_d2h", st.bytes_d2h},
          {"kv_last_group", st.last_group},
          {"infinigen", speculation_json(st)}};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// What of a KV policy the CUDA backend runs: the placements, and selection infinigen on `layer`
// (its KV twin has no retention or other representations yet; the pool without --kv-pool-limit evicts
// nothing).
struct CudaPolicy {
  policy::Placement placement = policy::Placement::kResident;
  policy::Selection selection = policy::Selection::kAll;
  std::string name;
};

CudaPolicy cuda_policy(const EngineArgs& e, std::string_view spec) {
  const policy::KvPolicy p = kv_policy_of(e, spec);
  const bool pool_unbounded = p.retention == policy::Retention::kPool && e.knobs.pool_limit == 0;
  if ((p.retention != policy::Retention::kNone && !pool_unbounded) ||
      p.representation != policy::Representation::kF16 ||
      (p.selection != policy::Selection::kAll && p.selection != policy::Selection::kInfinigen)) {
    fail(ErrorKind::kUnsupported,
         "--backend cuda runs the placements (resident, layer, headinfer) and layer+infinigen (no "
         "--kv-pool-limit) with f16 KV; '{}' needs the CPU backend",
         spec);
  }
  if (p.selection == policy::Selection::kInfinigen && p.placement != policy::Placement::kLayer) {
    fail(ErrorKind::kUnsupported,
         "--backend cuda runs selection infinigen on the layer placement; '{}' needs the "
         "CPU backend",
         spec);
  }
  return {p.placement, p.selection,
          p.selection == policy::Selection::kInfinigen ? "infinigen"
                                                       : std::string(policy::placement_name(p.placement))};
}

// The skew set of an infinigen run: the model's file (--skew), or for a synthetic model the identity
// (no trained skew: a speed run; said on stderr).
skew::SkewSet cuda_skew(const EngineArgs& e, const runtime::LoadedModel* model,
                        const model::ModelConfig& cfg) {
  if (model != nullptr) return runtime::load_infinigen_skew(*model, e.skew);
  std::vector<uint32_t> hk;
  for (const auto& l : cfg.layers) hk.push_back(l.n_head_kv);
  std::cerr << "kvtier: infinigen on a synthetic model: identity skew (A = I, the first "
            << skew::partial_columns(0.3, cfg.head_dim_k)
            << " columns): the speculation's cost, not its choices\n";
  return skew::identity_skew(hk, cfg.head_dim_k, 0.3f);
}

void set_selection(runtime_cuda::CudaSessionOptions& o, const EngineArgs& e, const CudaPolicy& p,
                   const skew::SkewSet* skew) {
  o.kv.selection = p.selection;
  if (p.selection != policy::Selection::kInfinigen) return;
  o.kv.skew = skew;
  o.kv.infinigen.alpha = static_cast<float>(e.knobs.infinigen_alpha);
  o.kv.infinigen.budget = e.knobs.infinigen_budget;
  o.kv.infinigen.group = e.knobs.infinigen_group;
}

}  // namespace

int run_generate_cuda(const EngineArgs& e, const runtime::LoadedModel& model,
                      std::span<const runtime::TokenId> prompt, const runtime::SamplerParams& sp,
                      const CudaRunArgs& a) {
  const CudaPolicy pol = cuda_policy(e, e.kv_policy);
  std::optional<skew::SkewSet> skew;
  if (pol.selection == policy::Selection::kInfinigen) skew = cuda_skew(e, &model, model.config);
  auto opts = cuda_options(e, pol.placement, static_cast<int64_t>(prompt.size()) + a.n_predict);
  set_selection(opts, e, pol, skew ? &*skew : nullptr);
  runtime_cuda::CudaSession s(model, opts);
  runtime::Sampler sampler(sp, model.config.n_vocab);
  std::vector<runtime::TokenId> history(prompt.begin(), prompt.end());
  std::vector<runtime::TokenId> out;
  const auto t0 = Clock::now();
  auto logits = s.prefill(prompt);
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();
  std::string reason = "max_tokens";
  size_t printed = 0;
  while (static_cast<int64_t>(out.size()) < a.n_predict) {
    const runtime::TokenId id = sampler.sample(logits, history);
    out.push_back(id);
    history.push_back(id);
    if (!a.ignore_eos && model.tokenizer->is_end_of_generation(id)) {
      reason = "end_of_generation";
      break;
    }
    if (!a.json) {  // whole text re-decoded: simple and correct for multi-token characters
      const std::string text = model.tokenizer->decode(out);
      if (text.size() > printed) std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::fflush(stdout);
      printed = text.size();
    }
    if (static_cast<int64_t>(out.size()) == a.n_predict || interrupted()) break;
    if (s.n_past() + 1 > s.n_ctx()) {
      reason = "context_full";
      break;
    }
    logits = s.decode(id);
  }
  const double decode_s = std::chrono::duration<double>(Clock::now() - t1).count();
  const double prefill_tps = prefill_s > 0 ? static_cast<double>(prompt.size()) / prefill_s : 0.0;
  const double decode_tps = decode_s > 0 ? static_cast<double>(out.size()) / decode_s : 0.0;
  if (a.json) {
    const nlohmann::json j = {{"backend", "cuda"},
                              {"text", tokenizer::utf8_sanitize(model.tokenizer->decode(out))},
                              {"tokens", out},
                              {"n_prompt", prompt.size()},
                              {"n_gen", out.size()},
                              {"stop_reason", reason},
                              {"prefill_s", prefill_s},
                              {"decode_s", decode_s},
                              {"prefill_tokens_per_s", prefill_tps},
                              {"decode_tokens_per_s", decode_tps},
                              {"seed", sp.seed},
                              {"ctx", s.n_ctx()},
                              {"chunk", s.chunk()},
                              {"kv_policy", e.kv_policy},
                              {"peak_memory_bytes", memory_json(s.ledger())},
                              {"cuda", device_json(s)}};
    std::cout << j.dump() << "\n";
  } else {
    std::fputc('\n', stdout);
    std::fprintf(stderr, "[cuda %s | %zu prompt tokens: %.1f tok/s | %zu generated: %.1f tok/s | %s]\n",
                 e.kv_policy.c_str(), prompt.size(), prefill_tps, out.size(), decode_tps, reason.c_str());
  }
  return 0;
}

int run_bench_cuda(const EngineArgs& e, const CudaBenchArgs& a) {
  std::vector<CudaPolicy> policies;
  for (const policy::KvPolicy& p : kv_policy_list(e, a.policies))
    policies.push_back(cuda_policy(e, p.spec()));
  if (a.repeat < 1) fail(ErrorKind::kInvalidArgument, "--repeat must be at least 1");
  const int64_t max_p = *std::max_element(a.prompt_tokens.begin(), a.prompt_tokens.end());
  // A GGUF file, or an in-memory synthetic model generated on the device.
  constexpr std::string_view kSynth = "synthetic:";
  std::unique_ptr<runtime::LoadedModel> file_model;
  std::optional<model::Preset> preset;
  model::SynthOptions so;
  model::ModelConfig synth_cfg;
  if (e.model.rfind(kSynth, 0) == 0) {
    preset = model::find_preset(e.model.substr(kSynth.size()));
    if (!preset)
      fail(ErrorKind::kInvalidArgument, "no preset '{}' (see kvtier synth --list)",
           e.model.substr(kSynth.size()));
    if (e.ctx > 0) so.n_ctx = static_cast<uint32_t>(std::max<int64_t>(e.ctx, preset->n_ctx));
    synth_cfg = model::make_config(model_cuda::preset_hparams(*preset, so));
  } else {
    file_model = runtime::load_model(e.model, runtime::LoadOptions{.cpu_isa = std::nullopt});
  }
  const model::ModelConfig& cfg = file_model ? file_model->config : synth_cfg;
  // The pinned host-to-device bandwidth, for the decode bound of offloaded placements (KV bytes copied
  // per decode step / this bandwidth); probed before any session takes the device's memory.
  require_device();
  cuda::CopyBandwidth bw;
  try {
    bw = cuda::measure_copy_bandwidth(0, size_t{256} << 20, 9);
  } catch (const std::exception& ex) {  // the bench goes on without the bound
    std::cerr << "kvtier: bench: the copy bandwidth probe failed (" << ex.what() << "); no decode bound\n";
  }
  const double h2d_gib_s = bw.h2d_gib_s;
  if (!a.json && bw.reps > 0) {
    std::cout << fmt::format(
        "pinned copy bandwidth ({} x {}, median): host-to-device {:.2f} GiB/s, "
        "device-to-host {:.2f} GiB/s\n",
        bw.reps, human_bytes(bw.bytes), bw.h2d_gib_s, bw.d2h_gib_s);
  }
  nlohmann::json rows = nlohmann::json::array();
  std::optional<skew::SkewSet> skew;
  for (const CudaPolicy& pol : policies) {
    if (pol.selection == policy::Selection::kInfinigen && !skew) skew = cuda_skew(e, file_model.get(), cfg);
  }
  for (const CudaPolicy& pol : policies) {
    // One session at a time: each takes the whole --device-mem arena.
    auto opts = cuda_options(e, pol.placement, max_p + a.gen);
    set_selection(opts, e, pol, skew ? &*skew : nullptr);
    std::unique_ptr<runtime_cuda::CudaSession> sp =
        file_model ? std::make_unique<runtime_cuda::CudaSession>(*file_model, opts)
                   : std::make_unique<runtime_cuda::CudaSession>(synth_cfg, *preset, so, opts);
    runtime_cuda::CudaSession& s = *sp;
    const std::string& name = pol.name;
    for (int64_t n : a.prompt_tokens) {
      if (n < 1 || n + a.gen > s.n_ctx()) {
        fail(ErrorKind::kInvalidArgument, "prompt of {} tokens + {} generated does not fit the context of {}",
             n, a.gen, s.n_ctx());
      }
      std::vector<runtime::TokenId> prompt;
      for (int64_t i = 0; i < n; ++i)
        prompt.push_back(static_cast<runtime::TokenId>((i * 7919 + 13) % cfg.n_vocab));
      std::vector<double> pre, dec;
      double h2d_per_token = 0.0;      // KV bytes copied host-to-device per decode step (last round)
      double fetched = -1.0;           // infinigen: rows loaded / rows held, speculated layers (last round)
      double spec_ms_per_token = 0.0;  // infinigen: speculation device time per decode step (last round)
      for (int r = -1; r < a.repeat; ++r) {  // round -1 warms up (cuBLAS heuristics, page tables)
        s.truncate(0);
        const auto t0 = Clock::now();
        auto logits = s.prefill(prompt);
        const double tp = std::chrono::duration<double>(Clock::now() - t0).count();
        const kv_cuda::DeviceKvStats before = s.kv_stats();
        const uint64_t h2d_before = before.bytes_h2d;
        const auto t1 = Clock::now();
        for (int64_t g = 0; g < a.gen; ++g) {
          const auto id = static_cast<runtime::TokenId>(runtime::first_max_index(logits));
          logits = s.decode(id);
        }
        const double td = std::chrono::duration<double>(Clock::now() - t1).count();
        if (a.gen > 0)
          h2d_per_token =
              static_cast<double>(s.kv_stats().bytes_h2d - h2d_before) / static_cast<double>(a.gen);
        const kv_cuda::DeviceKvStats after = s.kv_stats();
        if (after.spec_rows_total > before.spec_rows_total) {  // this round's speculation (the last kept)
          fetched = static_cast<double>(after.spec_rows_fetched - before.spec_rows_fetched) /
                    static_cast<double>(after.spec_rows_total - before.spec_rows_total);
          // The speculation's device time per decode step (its events are read one pass late: the last
          // step's is still pending and counted in the next round).
          spec_ms_per_token =
              (after.spec_ms - before.spec_ms) / static_cast<double>(std::max<int64_t>(a.gen - 1, 1));
        }
        throw_if_interrupted();
        if (r < 0) continue;
        pre.push_back(static_cast<double>(n) / tp);
        dec.push_back(static_cast<double>(a.gen) / td);
      }
      // Decode speed if every step only waited for its KV copies at the probed bandwidth.
      const double bound_tps =
          h2d_per_token > 0 && h2d_gib_s > 0 ? h2d_gib_s * 1073741824.0 / h2d_per_token : 0.0;
      const nlohmann::json row = {
          {"backend", "cuda"},
          {"policy", name},
          {"prompt_tokens", n},
          {"gen", a.gen},
          {"prefill_tokens_per_s", median(pre)},
          {"decode_tokens_per_s", median(dec)},
          {"prefill_runs", pre},
          {"decode_runs", dec},
          {"h2d_gib_s", h2d_gib_s},
          {"kv_h2d_bytes_per_decode_token", h2d_per_token},
          {"decode_h2d_bound_tokens_per_s", bound_tps},
          {"infinigen_fetched_fraction", fetched >= 0 ? nlohmann::json(fetched) : nullptr},
          {"infinigen_spec_ms_per_token", fetched >= 0 ? nlohmann::json(spec_ms_per_token) : nullptr},
          {"peak_memory_bytes", memory_json(s.ledger())},
          {"cuda", device_json(s)}};
      rows.push_back(row);
      if (!a.json) {
        std::cout << fmt::format(
            "cuda {:<9} prompt {:>7} -> prefill {:9.1f} tok/s | decode {:>4} -> {:8.2f} tok/s "
            "(median of {}) | arena peak {}{}{}\n",
            name, n, median(pre), a.gen, median(dec), a.repeat, human_bytes(s.memory_report().arena_peak),
            bound_tps > 0
                ? fmt::format(" | KV H2D {}/token at {:.1f} GiB/s: bound {:.2f} tok/s, decode = {:.2f}x "
                              "the bound's time",
                              human_bytes(static_cast<uint64_t>(h2d_per_token)), h2d_gib_s, bound_tps,
                              bound_tps / std::max(median(dec), 1e-9))
                : std::string(),
            fetched >= 0
                ? fmt::format(" | infinigen: {:.1f} % of the rows fetched, speculation {:.3f} ms/token",
                              100.0 * fetched, spec_ms_per_token)
                : std::string());
      }
    }
  }
  if (a.json) {
    std::cout << nlohmann::json({{"model", e.model},
                                 {"backend", "cuda"},
                                 {"repeat", a.repeat},
                                 {"h2d_gib_s", bw.h2d_gib_s},
                                 {"d2h_gib_s", bw.d2h_gib_s},
                                 {"results", rows}})
                     .dump()
              << "\n";
  }
  return 0;
}

}  // namespace kvtier::cli
