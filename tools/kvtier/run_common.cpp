#include "run_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "locret/head_scorer.h"
#include "policy/kv_pool.h"
#include "policy/placement.h"

namespace kvtier::cli {

void add_knob_flags(CLI::App* cmd, policy::PolicyKnobs& knobs) {
  const policy::PolicyKnobs k;
  cmd->add_option("--kv-budget", knobs.budget,
                  "h2o, quest, locret: KV tokens per sequence and layer kept (h2o; locret: per KV head) or "
                  "attended (quest); streaming: "
                  "sinks + window when --window is not given")
      ->check(non_negative());
  cmd->add_option("--sinks", knobs.sinks, "streaming: attention-sink tokens (the first ones) kept")
      ->default_val(k.sinks);
  cmd->add_option("--window", knobs.window, "streaming: recent tokens kept (default: --kv-budget - --sinks)")
      ->check(non_negative());
  cmd->add_option("--h2o-recent", knobs.h2o_recent, "h2o: share of --kv-budget kept for the recent tokens")
      ->default_val(k.h2o_recent);
  cmd->add_option("--stabilizers", knobs.stabilizers,
                  "locret: the last units kept after each non-final prefill chunk (default: --kv-budget / 4)")
      ->check(non_negative());
  cmd->add_option("--local-tail", knobs.local_tail,
                  "locret: the prompt's last tokens, prefilled after the last eviction and never evicted")
      ->default_val(k.local_tail)
      ->check(non_negative());
  cmd->add_option(
         "--locret-pool", knobs.locret_pool,
         "locret: rank each unit by the best score among this many neighbouring units (odd), so that a "
         "span such as a number is kept or evicted whole; 1: each unit's own score (the paper)")
      ->default_val(k.locret_pool);
  cmd->add_option("--locret-sinks", knobs.locret_sinks,
                  "locret: the prompt's first tokens (an instruction, a system prompt) are never evicted; 0: "
                  "none (the paper)")
      ->default_val(k.locret_sinks)
      ->check(non_negative());
  cmd->add_option_function<std::string>(
         "--locret-keys",
         [&knobs](const std::string& v) { knobs.locret_keys = policy::parse_locret_keys(v); },
         "locret: how a kept key is turned to its new position after an eviction: prerope (from a copy "
         "of the key before RoPE kept beside every row, the spec's cache) or rerotate (the stored key "
         "turned by the distance it moved: no copy, a third less KV memory per row with f16 KV, one more "
         "rounding per move; docs/locret.md)")
      ->default_str(std::string(policy::locret_keys_name(k.locret_keys)));
  cmd->add_option_function<std::string>(
         "--locret-positions",
         [&knobs](const std::string& v) { knobs.locret_positions = policy::parse_locret_positions(v); },
         "locret: the positions of the kept rows: compact (renumbered 0, 1, ... after every eviction, the "
         "spec's default: positions stay below budget + tail + chunk + generated) or original (each row "
         "keeps its true position, nothing is re-rotated and no pre-RoPE copy is kept: the full model's "
         "attention over the kept rows; resident placement only; docs/locret.md)")
      ->default_str(std::string(policy::locret_positions_name(k.locret_positions)));
  cmd->add_option_function<std::string>(
         "--locret-sliding",
         [&knobs](const std::string& v) { knobs.locret_sliding = policy::parse_locret_sliding(v); },
         "locret: what a layer with a sliding window of its own (Gemma-3's local layers) keeps: recent (its "
         "most recent rows, as its window does) or scored (the retaining heads' best, as a global layer: "
         "better on Gemma-3's passkey at 4K, worse on its niah; docs/accuracy.md)")
      ->default_str(std::string(policy::locret_sliding_name(k.locret_sliding)));
  cmd->add_option_function<std::string>(
         "--locret-span",
         [&knobs](const std::string& v) { knobs.locret_span = policy::parse_locret_span(v); },
         "locret: what is kept or evicted whole: token (each token by its own score, the paper), word (the "
         "tokens of a word or a number rank by the best score among them, so a number split into digits is "
         "kept or evicted as one; only the budget's cut or the protected rows can split it) or number (runs "
         "of digits only); docs/locret.md")
      ->default_str(std::string(policy::locret_span_name(k.locret_span)));
  cmd->add_option("--quest-page", knobs.quest_page, "quest: tokens per page")->default_val(k.quest_page);
  cmd->add_option("--kivi-group", knobs.kivi_group, "kivi4, kivi2: tokens per key-quantisation group")
      ->default_val(k.kivi_group);
  cmd->add_option("--kivi-residual", knobs.kivi_residual,
                  "kivi4, kivi2: recent tokens kept in full precision")
      ->default_val(k.kivi_residual);
  cmd->add_option(
         "--recompute", knobs.recompute,
         "kvpr: positions whose K/V are recomputed from stored inputs on each visit: auto (the "
         "scheduler's split), N (min(N, positions): forces the split, for tests and sweeps) or random "
         "(a pseudo-random split on every visit, for tests); with auto, random and 0 a decode step that "
         "recomputes nothing stores no inputs, and the split never passes the stored inputs; kivi4+kvpr, "
         "kivi2+kvpr: whole --kivi-group groups of the quantised positions (N rounded down)")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"auto", "-1"}, {"random", "-2"}}))
      ->default_str("auto");
  cmd->add_option(
         "--act-ratio", knobs.act_ratio,
         "hybrid (hybridserve): ACT:KV block ratio R of the hybrid cache (Eq. 11): auto (Algorithm 1 "
         "from the profiled link, projection rate and streamed-weight load time) or R >= 0 (0: all "
         "KV, inf: all activation checkpoints)")
      ->transform(CLI::Transformer(std::map<std::string, std::string>{{"auto", "-1"}}))
      ->default_str("auto");
  cmd->add_option("--infinigen-alpha", knobs.infinigen_alpha,
                  "infinigen: a row is loaded when its speculated score exceeds max - alpha (scaled logits; "
                  "inf: every row)")
      ->default_val(k.infinigen_alpha);
  cmd->add_option(
         "--infinigen-budget", knobs.infinigen_budget,
         "infinigen: at most this share of a sequence's rows loaded per KV head and step (1: no cap)")
      ->default_val(k.infinigen_budget);
  cmd->add_option_function<std::string>(
         "--infinigen-group",
         [&knobs](const std::string& v) { knobs.infinigen_group = policy::parse_infinigen_group(v); },
         "infinigen with grouped-query attention: how the query heads of a KV head combine their scores: "
         "relative (each head from its own maximum: a row is kept when some head gives it more than "
         "e^-alpha of its top weight) or max (the largest raw score of the group, the spec's rule); one "
         "query head per KV head: the same rows either way")
      ->default_str(std::string(policy::infinigen_group_name(k.infinigen_group)));
  cmd->add_option_function<std::string>(
         "--kv-pool-limit",
         [&knobs](const std::string& v) { knobs.pool_limit = parse_bytes(v, "--kv-pool-limit"); },
         "pool (layer+infinigen+pool): bytes of K/V rows the layers that speculate keep, e.g. 64MiB; "
         "slots per layer, sequence and KV head = limit / (their KV heads x sequences x 2 x row bytes), "
         "whole 256-row pages from 256 on; past that each new token replaces a victim's row (a longer "
         "prompt evicts between its --chunk passes); host or --kv-disk home; default: no limit")
      ->default_str("none");
  cmd->add_option_function<std::string>(
         "--kv-pool-eviction",
         [&knobs](const std::string& v) { knobs.pool_eviction = policy::parse_pool_eviction(v); },
         "pool: the victim among the older half of the slots: counter (fewest fetches, counters halved at "
         "255; the paper's), fifo (oldest position) or lru (least recently fetched)")
      ->default_str("counter");
  cmd->add_option_function<std::string>(
         "--kv-pool-prefill",
         [&knobs](const std::string& v) { knobs.pool_prefill = policy::parse_pool_prefill(v); },
         "pool, a prompt longer than the pool (counter and lru; fifo evicts by age): order (the lowest "
         "slot of the older half, the oldest rows, as at decode before any fetch) or weight (the row "
         "with the least cumulative prefill attention; the spec's §15.13 extension, which computes "
         "attention weights at prefill); docs/infinigen.md compares them")
      ->default_str(std::string(policy::pool_prefill_name(k.pool_prefill)));
}

std::string knob_flags_text(const policy::PolicyKnobs& k) {
  const policy::PolicyKnobs d;
  std::string c;
  const auto add = [&c](bool differs, std::string_view flag, const auto& v) {
    if (differs) c += fmt::format(" {} {}", flag, v);
  };
  add(k.budget != d.budget, "--kv-budget", k.budget);
  add(k.sinks != d.sinks, "--sinks", k.sinks);
  add(k.window != d.window, "--window", k.window);
  add(k.h2o_recent != d.h2o_recent, "--h2o-recent", k.h2o_recent);
  add(k.quest_page != d.quest_page, "--quest-page", k.quest_page);
  add(k.kivi_group != d.kivi_group, "--kivi-group", k.kivi_group);
  add(k.kivi_residual != d.kivi_residual, "--kivi-residual", k.kivi_residual);
  if (k.recompute != d.recompute)
    c += k.recompute == policy::PolicyKnobs::kRecomputeRandom ? std::string(" --recompute random")
                                                              : fmt::format(" --recompute {}", k.recompute);
  add(k.act_ratio != d.act_ratio, "--act-ratio", k.act_ratio);
  add(k.infinigen_alpha != d.infinigen_alpha, "--infinigen-alpha", k.infinigen_alpha);
  add(k.infinigen_budget != d.infinigen_budget, "--infinigen-budget", k.infinigen_budget);
  add(k.infinigen_group != d.infinigen_group, "--infinigen-group",
      policy::infinigen_group_name(k.infinigen_group));
  add(k.stabilizers != d.stabilizers, "--stabilizers", k.stabilizers);
  add(k.local_tail != d.local_tail, "--local-tail", k.local_tail);
  add(k.locret_pool != d.locret_pool, "--locret-pool", k.locret_pool);
  add(k.locret_sinks != d.locret_sinks, "--locret-sinks", k.locret_sinks);
  add(k.locret_keys != d.locret_keys, "--locret-keys", policy::locret_keys_name(k.locret_keys));
  add(k.locret_positions != d.locret_positions, "--locret-positions",
      policy::locret_positions_name(k.locret_positions));
  add(k.locret_sliding != d.locret_sliding, "--locret-sliding",
      policy::locret_sliding_name(k.locret_sliding));
  add(k.locret_span != d.locret_span, "--locret-span", policy::locret_span_name(k.locret_span));
  add(k.pool_limit != d.pool_limit, "--kv-pool-limit", k.pool_limit);
  add(k.pool_eviction != d.pool_eviction, "--kv-pool-eviction", policy::pool_eviction_name(k.pool_eviction));
  add(k.pool_prefill != d.pool_prefill, "--kv-pool-prefill", policy::pool_prefill_name(k.pool_prefill));
  return c;
}

void add_engine_flags(CLI::App* cmd, EngineArgs& a, bool with_policy) {
  cmd->add_option("-m,--model", a.model, "GGUF model file")->required();
  cmd->add_option("--ctx", a.ctx, "context size in tokens (KV cache capacity)")->check(non_negative());
  cmd->add_option("--chunk", a.chunk, "prefill chunk in tokens (default: chosen for memory, at most 512)")
      ->check(non_negative());
  cmd->add_option("-t,--threads", a.threads, "worker threads (default: all cores)")->check(non_negative());
  cmd->add_option("--kv-type", a.kv_type, "KV cache element type (the representation axis; default f16)")
      ->check(CLI::IsMember({"f16", "f32"}));
  cmd->add_option("--isa", a.isa, "CPU kernel path (default: the best the CPU has)")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  if (with_policy) {
    cmd->add_option("--kv-policy", a.kv_policy,
                    "KV policy: a preset (resident, layer, headinfer, kvpr, hybridserve, locret) or axis "
                    "values joined by "
                    "'+', e.g. "
                    "layer+sliding; `kvtier policies` lists them all and which are exact")
        ->capture_default_str();
  }
  cmd->add_option(
      "--kv-mem", a.kv_mem,
      "compute-local memory for KV (resident: all of it; offloaded: staging buffers, static heads), its "
      "new-row staging and attention scratch, e.g. 256MiB; default: as needed");
  cmd->add_option(
      "--kv-disk", a.kv_disk,
      "offloaded policies: keep the KV master copy in an unnamed file in this directory (O_DIRECT; "
      "removed at exit) instead of host memory");
  cmd->add_option("--host-mem", a.host_mem, "budget of host memory for offloaded KV, e.g. 8GiB");
  cmd->add_option(
         "--link-gbps", a.link_gbps,
         "offloaded policies, a measurement aid: pace loads from the home tier to at most this many "
         "GB/s, to reproduce a link that is slow relative to compute (the KVPR regime); 0: not paced")
      ->check(non_negative());
  cmd->add_option("--weights-mem", a.weights_mem,
                  "compute-local memory for weights, e.g. 200MiB: the leading layers that fit stay resident "
                  "beside two staging buffers, the others are streamed into them on every pass, layer l+1 "
                  "while layer l computes (exact); default: all weights resident");
  cmd->add_flag("--no-layer-lanes", a.no_layer_lanes,
                "keep the layers' matrices in their GGUF rows only: no rows-in-lanes copy (decode is "
                "slower, and on the AVX-512 path without AMX prefill too; where prefill reads the GGUF "
                "rows, on the AVX2 path and with AMX, the copy costs the layers' bytes again, shown as "
                "device weights; elsewhere it replaces them and their pages are handed back). Implied by "
                "--weights-mem");
  cmd->add_option("--weights-from", a.weights_from,
                  "where streamed layers come from: host (a copy in host memory, counted against "
                  "--host-mem) or file (read from the GGUF file on every pass, O_DIRECT where the file "
                  "system allows it); --link-gbps paces these loads too")
      ->transform(CLI::CheckedTransformer(std::map<std::string, policy::WeightSource>{
          {"host", policy::WeightSource::kHost}, {"file", policy::WeightSource::kFile}}))
      ->default_str("host");
  cmd->add_option("--skew", a.skew,
                  "infinigen: the model's skew file from `kvtier skew` (default: the model's path with "
                  ".skew.gguf)");
  cmd->add_option("--profile-cache", a.profile_cache,
                  "kvpr --recompute auto, hybridserve --act-ratio auto: file of cached link and projection "
                  "profiles (default: "
                  "$KVTIER_PROFILE_CACHE, else $XDG_CACHE_HOME/kvtier/profile.json, else "
                  "~/.cache/kvtier/profile.json)");
  cmd->add_option("--group", a.group, "headinfer: KV heads per offloaded unit (0: adaptive)")
      ->capture_default_str();
  cmd->add_option("--prefetch-depth", a.prefetch_depth, "offloaded policies: units loaded ahead")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  cmd->add_option("--static-heads", a.static_heads, "headinfer: first KV heads (layer-major) kept resident")
      ->capture_default_str();
  add_knob_flags(cmd, a.knobs);
  cmd->add_option("--locret-heads", a.locret_heads,
                  "locret: retaining heads trained for this model (kvtier train-locret; "
                  "scripts/train_locret_heads.sh MODEL OUT_DIR)");
  cmd->add_option("--backend", a.backend,
                  "compute backend: cpu (default), or cuda (an NVIDIA GPU; a CUDA build)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, Backend>{{"cpu", Backend::kCpu}, {"cuda", Backend::kCuda}}));
  cmd->add_option("--device-mem", a.device_mem,
                  "--backend cuda: device memory the engine may use (weights, activations, KV), e.g. 24GiB; "
                  "default: 90% of the free memory");
  cmd->add_option(
         "--kv-gather", a.kv_gather,
         "--backend cuda, infinigen: the kernel that reads the chosen rows from host memory: persistent "
         "(about one block per SM beside the compute kernels) or flat (one thread per 16 bytes)")
      ->check(CLI::IsMember({"persistent", "flat"}))
      ->default_str("persistent");
  // Hidden test hooks: fault injection and random copy delays (to flush out ordering races).
  cmd->add_option("--debug-kv-disk-fail-after", a.debug_disk_fail_after)->group("");
  cmd->add_option("--debug-copy-delay-us", a.debug_copy_delay_us)->group("");
}

void add_sample_flags(CLI::App* cmd, SampleArgs& a, const runtime::SamplerParams& d) {
  a.p = d;
  cmd->add_option("--temp", a.p.temperature, "sampling temperature (0: greedy)")->default_val(d.temperature);
  cmd->add_option("--top-k", a.p.top_k, "keep the k most likely tokens (0: off)")->default_val(d.top_k);
  cmd->add_option("--top-p", a.p.top_p, "nucleus sampling mass (1: off)")->default_val(d.top_p);
  cmd->add_option("--min-p", a.p.min_p, "drop tokens below min-p x the top probability (0: off)")
      ->default_val(d.min_p);
  cmd->add_option("--repeat-penalty", a.p.repeat_penalty, "repetition penalty (1: off)")
      ->default_val(d.repeat_penalty);
  cmd->add_option("--presence-penalty", a.p.presence_penalty, "presence penalty (0: off)")
      ->default_val(d.presence_penalty);
  cmd->add_option("--frequency-penalty", a.p.frequency_penalty, "frequency penalty (0: off)")
      ->default_val(d.frequency_penalty);
  cmd->add_option("--repeat-last-n", a.p.penalty_last_n, "tokens the penalties look back (-1: all)")
      ->default_val(d.penalty_last_n);
  cmd->add_option("--seed", a.seed, "random seed (default: random; printed with --json)");
}

std::string profile_cache_path(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* p = std::getenv("KVTIER_PROFILE_CACHE"); p != nullptr && *p != 0) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != 0)
    return fmt::format("{}/kvtier/profile.json", x);
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != 0)
    return fmt::format("{}/.cache/kvtier/profile.json", h);
  return {};
}

runtime::LoadOptions load_options(const EngineArgs& a) {
  runtime::LoadOptions o;
  o.pack_layers = a.weights_mem.empty() && !a.no_layer_lanes;  // streamed layers: their staged GGUF rows
  if (a.backend == Backend::kCuda) {
    o.cpu_isa.reset();
  } else if (const auto isa = cli::isa_flag(a.isa)) {
    o.cpu_isa = *isa;
  }
  return o;
}

runtime::SessionOptions session_options(const EngineArgs& a, const model::ModelConfig& cfg,
                                        int64_t ctx_needed, LocretHeads heads) {
  if (a.backend == Backend::kCuda)
    fail(ErrorKind::kUnsupported, "--backend cuda: only run and bench support it so far");
  if (!a.device_mem.empty()) fail(ErrorKind::kInvalidArgument, "--device-mem applies to --backend cuda only");
  if (!a.kv_gather.empty()) fail(ErrorKind::kInvalidArgument, "--kv-gather applies to --backend cuda only");
  runtime::SessionOptions o;
  o.threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  o.isa = cli::isa_flag(a.isa);
  if (a.ctx > 0) {
    o.n_ctx = a.ctx;
  } else {
    const int64_t bt = o.kv_block_tokens;
    o.n_ctx = std::max<int64_t>(bt, (ctx_needed + bt - 1) / bt * bt);
    if (cfg.n_ctx_train > 0 && ctx_needed <= cfg.n_ctx_train)
      o.n_ctx = std::min<int64_t>(o.n_ctx, cfg.n_ctx_train);
  }
  o.chunk = a.chunk > 0 ? a.chunk : runtime::default_chunk(cfg);
  const policy::KvPolicy kp = kv_policy_of(a, a.kv_policy);
  o.kv_dtype = kp.representation == policy::Representation::kF32 ? cpu::KvDtype::kF32 : cpu::KvDtype::kF16;
  auto& p = o.kv_placement;
  p.placement.placement = kp.placement;
  p.retention = kp.retention;
  p.selection = kp.selection;
  p.representation = kp.representation;
  p.knobs = kp.knobs;
  if (kp.retention == policy::Retention::kLocret &&
      (heads == LocretHeads::kRequired || !a.locret_heads.empty()))
    p.scorer = locret::load_head_scorer(a.locret_heads, a.model, cfg);
  p.placement.group = a.group;
  p.placement.prefetch_depth = a.prefetch_depth;
  p.placement.static_heads = a.static_heads;
  if (!a.kv_mem.empty()) p.kv_mem = parse_bytes(a.kv_mem, "--kv-mem");
  p.disk_dir = a.kv_disk;
  if (a.debug_disk_fail_after > 0) {
    p.disk_faults.fail_after_bytes = a.debug_disk_fail_after;
    p.disk_faults.error = EIO;
  }
  p.copy_delay_us = a.debug_copy_delay_us;
  p.link_bytes_per_s = a.link_gbps * 1e9;
  if (!a.weights_mem.empty()) o.weights.budget = parse_bytes(a.weights_mem, "--weights-mem");
  o.weights.source = a.weights_from;
  o.weights.link_bytes_per_s = a.link_gbps * 1e9;
  if (a.link_gbps > 0 && p.placement.placement == policy::Placement::kResident && o.weights.budget == 0)
    fail(ErrorKind::kInvalidArgument,
         "--link-gbps paces the home tier of offloaded policies and streamed weights; resident with all "
         "weights resident has neither");
  if (policy::stores_inputs(p.representation)) o.profile_cache = profile_cache_path(a.profile_cache);
  if (!a.host_mem.empty()) o.host_mem = parse_bytes(a.host_mem, "--host-mem");
  o.skew_path = a.skew;
  return o;
}

policy::KvPolicy kv_policy_of(const EngineArgs& a, std::string_view spec) {
  policy::KvPolicy d;
  if (a.kv_type == "f32") d.representation = policy::Representation::kF32;
  policy::KvPolicy p = policy::parse_kv_policy(spec, d);
  if (!a.kv_type.empty() && p.representation != d.representation) {
    fail(ErrorKind::kInvalidArgument, "--kv-type {} and --kv-policy {} name different representations",
         a.kv_type, spec);
  }
  p.knobs = a.knobs;
  policy::check_knobs(p);
  return p;
}

std::vector<policy::KvPolicy> kv_policy_list(const EngineArgs& a, std::string_view list) {
  policy::KvPolicy d;
  if (a.kv_type == "f32") d.representation = policy::Representation::kF32;
  std::vector<policy::KvPolicy> out = policy::parse_kv_policy_list(list, d);  // unknown or repeated items
  for (policy::KvPolicy& p : out) {
    p.knobs = a.knobs;
    policy::check_knobs(p);
  }
  for (std::string_view rest = list;;) {  // and each item against an explicit --kv-type
    const size_t comma = rest.find(',');
    (void)kv_policy_of(a, rest.substr(0, comma));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

EngineArgs engine_for(const EngineArgs& a, const policy::KvPolicy& p) {
  EngineArgs e = a;
  e.kv_policy = p.spec();
  if (p.placement == policy::Placement::kResident) {
    e.kv_disk.clear();
    e.link_gbps = 0;
    e.group = 0;
    e.static_heads = 0;
  }
  return e;
}

nlohmann::json weights_json(const runtime::Session& session) {
  const model::WeightStreamStats w = session.weight_stats();
  const kv::MemoryLedger& l = session.ledger();
  nlohmann::json j;
  j["resident_layers"] = w.resident_layers;
  j["streamed_layers"] = w.streamed_layers;
  j["resident_bytes"] = w.resident_bytes;
  j["staging_bytes"] = w.staging_bytes;
  j["streamed_bytes"] = w.streamed_bytes;
  j["source"] = w.streamed_layers == 0 ? "none" : w.source == policy::WeightSource::kHost ? "host" : "file";
  j["direct_io"] = w.direct_io;
  j["bytes_loaded"] = w.bytes_loaded;
  j["layer_loads"] = w.layer_loads;
  j["stall_s"] = w.wait_seconds;
  j["bytes_by_tier"] = {{"device", l.peak(kv::Tier::kDevice, kv::Category::kWeights)},
                        {"host", l.peak(kv::Tier::kHost, kv::Category::kWeights)},
                        {"disk", l.peak(kv::Tier::kDisk, kv::Category::kWeights)}};
  return j;
}

nlohmann::json kv_json(const runtime::Session& session, const EngineArgs& a) {
  nlohmann::json j;
  j["policy"] = kv_policy_of(a, a.kv_policy).spec();
  j["kv_bytes_peak"] = session.ledger().peak(kv::Tier::kDevice, kv::Category::kKv) +
                       session.ledger().peak(kv::Tier::kHost, kv::Category::kKv) +
                       session.ledger().peak(kv::Tier::kDisk, kv::Category::kKv);
  const auto st = session.kv_stats();
  if (!st) {
    j["bytes_loaded"] = 0;
    j["bytes_stored"] = 0;
    j["stall_s"] = 0.0;
    return j;
  }
  j["group"] = st->group;
  j["home"] = st->home;
  j["bytes_loaded"] = st->transfer.bytes_loaded;  // read from the home tier: page-rounded, slack included
  j["bytes_slack"] = st->transfer.slack_bytes;    // of them: gaps read through to merge a gather's reads
  j["bytes_stored"] = st->transfer.bytes_stored;
  j["stall_s"] = st->transfer.wait_seconds;
  j["copy_busy_s"] = st->transfer.busy_seconds;
  j["copy_jobs"] = st->transfer.jobs;
  j["copy_blocks"] = st->transfer.blocks;  // blocks the jobs named
  j["copy_runs"] = st->transfer.runs;      // I/O calls after coalescing adjacent blocks
  j["sync_loads"] = st->sync_loads;
  if (a.kv_policy == "hybridserve" ||
      kv_policy_of(a, a.kv_policy).representation == policy::Representation::kHybrid) {
    j["act_ratio"] = std::isinf(st->act_ratio) ? nlohmann::json("inf") : nlohmann::json(st->act_ratio);
    // Algorithm 2: batched passes planned, mini-batches formed, and the last batched pass's plan.
    j["mini_batches"] = {{"passes", st->mb_passes},       {"formed", st->mb_formed},
                         {"last", st->mb_last},           {"last_seqs", st->mb_last_seqs},
                         {"reordered", st->mb_reordered}, {"balanced", st->mb_balanced}};
  }
  j["recomputed_rows"] = st->recomputed_rows;    // kvpr: K/V rows recomputed from stored inputs
  j["split"] = st->last_split;                   // kvpr: rows recomputed on the last unit visit
  j["splits"] = st->pass_splits;                 // kvpr: the same for each pass (prefill chunks, steps)
  j["payload_x_bytes"] = st->payload_x_bytes;    // kvpr: stored inputs the visits used
  j["payload_kv_bytes"] = st->payload_kv_bytes;  // K/V rows of past positions the visits used
  if (kv_policy_of(a, a.kv_policy).selection == policy::Selection::kQuest) {
    // quest on an offloaded placement: the decode steps' page selections and the loads that moved them.
    const kv::QuestStats& q = st->quest;
    j["quest"] = {
        {"layer_steps", q.layer_steps},
        {"rows_total", q.rows_total},
        {"rows_fetched", q.rows_fetched},
        {"fetched_fraction",
         q.rows_total == 0 ? 1.0 : static_cast<double>(q.rows_fetched) / static_cast<double>(q.rows_total)},
        {"selective_loads", q.selective_loads}};
  }
  if (const kv::InfinigenStats& ig = st->infinigen; ig.layer_steps_of.size() > 0) {
    // infinigen: the decode steps' speculations (layers >= 2 without a window of their own).
    nlohmann::json g;
    g["layer_steps"] = ig.layer_steps;
    g["rows_total"] = ig.rows_total;      // per (sequence, KV head): positions before the current token
    g["rows_fetched"] = ig.rows_fetched;  // of them loaded and attended
    g["fetched_fraction"] =
        ig.rows_total == 0 ? 0.0 : static_cast<double>(ig.rows_fetched) / static_cast<double>(ig.rows_total);
    g["n_sel_min"] = ig.n_sel_min;
    g["n_sel_max"] = ig.n_sel_max;
    g["n_sel_mean"] = ig.layer_steps == 0 ? 0.0 : static_cast<double>(ig.n_sel_sum) / ig.layer_steps;
    nlohmann::json layers = nlohmann::json::array();  // per layer: mean n_sel and fetched fraction
    for (size_t l = 0; l < ig.layer_steps_of.size(); ++l) {
      if (ig.layer_steps_of[l] == 0) continue;
      layers.push_back({{"layer", l},
                        {"steps", ig.layer_steps_of[l]},
                        {"n_sel_mean", static_cast<double>(ig.layer_n_sel_sum[l]) / ig.layer_steps_of[l]},
                        {"fetched_fraction", ig.layer_rows_total[l] == 0
                                                 ? 0.0
                                                 : static_cast<double>(ig.layer_rows_fetched[l]) /
                                                       static_cast<double>(ig.layer_rows_total[l])}});
    }
    g["layers"] = layers;
    g["speculation_s"] = ig.spec_seconds;
    g["stall_s"] = st->transfer.wait_seconds;  // the compute thread waiting for loads (all layers)
    g["partial_keys_build_s"] = ig.pk_build_seconds;
    g["partial_keys_build_bytes"] = ig.pk_build_bytes;
    g["selective_loads"] = ig.selective_loads;
    if (ig.pool_slots > 0) {  // retention pool with a limit (layers that speculate)
      nlohmann::json pool;
      pool["limit_bytes"] = a.knobs.pool_limit;
      pool["eviction"] = policy::pool_eviction_name(a.knobs.pool_eviction);
      pool["prefill"] = policy::pool_prefill_name(a.knobs.pool_prefill);
      pool["slots"] = ig.pool_slots;  // per (sequence, layer, KV head)
      pool["live_max"] = ig.pool_live_max;
      pool["live_rows"] = ig.pool_live_rows;
      pool["evictions"] = ig.pool_evictions;
      pool["prefill_evictions"] = ig.pool_prefill_evictions;  // a prompt longer than the pool
      pool["young_victims"] = ig.pool_young_victims;
      pool["max_evicted_pos"] = ig.pool_max_evicted_pos;
      nlohmann::json pl = nlohmann::json::array();
      for (size_t l = 0; l < ig.layer_pool_min_live.size(); ++l) {
        if (ig.layer_pool_min_live[l] < 0) continue;
        pl.push_back({{"layer", l},
                      {"evictions", ig.layer_pool_evictions[l]},
                      {"min_live_pos", ig.layer_pool_min_live[l]}});
      }
      pool["layers"] = pl;
      g["pool"] = pool;
    }
    j["infinigen"] = g;
  }
  return j;
}

runtime::SamplerParams sampler_params(const SampleArgs& a) {
  runtime::SamplerParams p = a.p;
  p.seed = a.seed ? *a.seed : std::random_device{}();
  return p;
}

nlohmann::json memory_json(const kv::MemoryLedger& ledger) {
  nlohmann::json j = nlohmann::json::object();
  for (int t = 0; t < kv::kNumTiers; ++t) {
    const auto tier = static_cast<kv::Tier>(t);
    nlohmann::json jt = nlohmann::json::object();
    for (int c = 0; c < kv::kNumCategories; ++c) {
      const auto cat = static_cast<kv::Category>(c);
      jt[std::string(kv::category_name(cat))] = ledger.peak(tier, cat);
    }
    jt["total"] = ledger.peak(tier);
    j[std::string(kv::tier_name(tier))] = jt;
  }
  return j;
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail(ErrorKind::kInvalidArgument, "'{}' is a directory, not a text file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "cannot open '{}'", path);
  std::ostringstream ss;
  if (in.peek() != std::ifstream::traits_type::eof()) ss << in.rdbuf();  // (<< of an empty file fails)
  if (in.bad()) fail(ErrorKind::kIo, "cannot read '{}'", path);
  return ss.str();
}

ProgressBar::ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}

void ProgressBar::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  constexpr int kWidth = 30;
  const int fill = static_cast<int>(kWidth * done / total);
  std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", label_.c_str(),
               std::string(static_cast<size_t>(fill), '=').c_str(),
               std::string(static_cast<size_t>(kWidth - fill), ' ').c_str(), static_cast<long long>(done),
               static_cast<long long>(total));
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
  drawn_ = false;
}

}  // namespace kvtier::cli
