// Flags and helpers shared by the commands that run a model (run, chat, perplexity, bench).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "kv/ledger.h"
#include "policy/kv_policy.h"
#include "policy/weight_plan.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kvtier::cli {

enum class Backend { kCpu, kCuda };

struct EngineArgs {
  std::string model;
  int64_t ctx = 0;      // 0: chosen by the command
  int64_t chunk = 0;    // 0: runtime::default_chunk
  int threads = 0;      // 0: all cores
  std::string kv_type;  // f16 | f32; empty: the policy's representation (f16 unless it names one)
  std::string skew;     // --skew: infinigen's skew file (empty: next to the model)
  std::string isa;      // empty: best
  // KV placement.
  std::string kv_policy = "resident";  // a preset or a '+'-joined spec (policy/kv_policy.h)
  std::string kv_mem;                  // compute-local KV budget ("512MiB"); empty = as needed
  std::string kv_disk;                 // directory of the disk home tier
  std::string host_mem;
  uint32_t group = 0;
  uint32_t prefetch_depth = 1;
  uint32_t static_heads = 0;
  policy::PolicyKnobs knobs;  // the approximate values' tuning (--kv-budget, --sinks, ...)
  std::string locret_heads;   // --locret-heads: the retaining heads the locret retention scores with
  double link_gbps = 0;       // --link-gbps: pace home-tier loads (a measurement aid)
  std::string profile_cache;  // --profile-cache (kvpr auto); empty: the default location
  // Test hooks (hidden flags): inject a disk-tier write failure, delay every copy job.
  uint64_t debug_disk_fail_after = 0;
  uint32_t debug_copy_delay_us = 0;
  Backend backend = Backend::kCpu;  // cuda: cuda_backend.h; --device-mem is its arena budget
  std::string device_mem;
  std::string kv_gather;  // --kv-gather: InfiniGen's gather kernel on the GPU (empty: persistent)
  // Weight placement (HybridServe): compute-local bytes for weights ("2GiB"; empty = all resident)
  // and where streamed layers come from.
  std::string weights_mem;
  policy::WeightSource weights_from = policy::WeightSource::kHost;
  bool no_layer_lanes = false;  // --no-layer-lanes: no rows-in-lanes copies of the layers' matrices
};

struct SampleArgs {
  runtime::SamplerParams p;
  std::optional<uint64_t> seed;
};

// The approximate policies' knobs (--kv-budget, --sinks, --window, --h2o-recent, --quest-page, ...).
void add_knob_flags(CLI::App* cmd, policy::PolicyKnobs& knobs);
// The knob flags whose values differ from the defaults, as they would be typed (" --kv-budget 32
// --infinigen-alpha 8"); "" when every knob is at its default. For the commands a results file records.
std::string knob_flags_text(const policy::PolicyKnobs& knobs);
// with_policy = false leaves out --kv-policy (for commands that take a list of policies).
void add_engine_flags(CLI::App* cmd, EngineArgs& a, bool with_policy = true);
void add_sample_flags(CLI::App* cmd, SampleArgs& a, const runtime::SamplerParams& defaults);

// Session options from the flags; `ctx_needed` is used when --ctx is not given (rounded up to a
// block, capped by the model's training context when that is larger).
// The KVPR profile cache: --profile-cache, else $KVTIER_PROFILE_CACHE, else
// $XDG_CACHE_HOME/kvtier/profile.json, else $HOME/.cache/kvtier/profile.json; empty if none is set.
std::string profile_cache_path(const std::string& given);
// What session_options does with locret's retaining heads (--locret-heads): a session scores with
// them, so they are required; a planner only sizes the KV (locret's rows, b + n_loc + B per layer and
// KV head, do not depend on the scores), so it loads and checks them only when they are given.
enum class LocretHeads { kRequired, kIfGiven };
runtime::SessionOptions session_options(const EngineArgs& a, const model::ModelConfig& cfg,
                                        int64_t ctx_needed, LocretHeads heads = LocretHeads::kRequired);
// How the engine's model is loaded: its weights laid out for the CPU path --isa names (the best one
// by default; the layers' matrices unless --weights-mem or --no-layer-lanes), or left as mapped for
// --backend cuda.
runtime::LoadOptions load_options(const EngineArgs& a);
// The KV policy `spec` names, --kv-type giving the representation it leaves out (a spec that names
// another representation than an explicit --kv-type is an error).
policy::KvPolicy kv_policy_of(const EngineArgs& a, std::string_view spec);
std::vector<policy::KvPolicy> kv_policy_list(const EngineArgs& a, std::string_view list);
// The engine flags for one policy of a list: --kv-policy set to it; the offloaded placements' flags
// (--group, --static-heads, --kv-disk) dropped for resident, where they do not apply.
EngineArgs engine_for(const EngineArgs& a, const policy::KvPolicy& p);
// Sampler parameters with the seed resolved (a random one if none was given).
runtime::SamplerParams sampler_params(const SampleArgs& a);

// {"device": {"weights": B, "kv": B, ..., "total": B}, "host": {...}, "disk": {...}} of peak bytes.
nlohmann::json memory_json(const kv::MemoryLedger& ledger);
// {"policy": ..., "group": g, "home": ..., "bytes_loaded": B, "bytes_stored": B, "stall_s": s, ...}
nlohmann::json kv_json(const runtime::Session& session, const EngineArgs& a);
// Weight placement of a session: resident and streamed layers, bytes by tier, streaming counters.
nlohmann::json weights_json(const runtime::Session& session);
std::string read_text_file(const std::string& path);

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace kvtier::cli
