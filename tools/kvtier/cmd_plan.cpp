// kvtier plan: predicted memory per tier and category of each KV placement method for a model and
// context as the HeadInfer paper models it (weights + KV + S*D + 2*S*I activations), the largest
// context each reaches within the budgets, and (given hardware rates) a roofline estimate of prefill
// and decode time. With -m, also what this engine allocates for `kvtier run` with the same flags
// (cmd_plan_engine.h): every buffer by tier and category, equal to run's measured peaks.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_features.h"
#include "cli_util.h"
#include "cmd_plan_engine.h"
#include "commands.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "model/hparams.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "policy/memory_model.h"
#include "policy/placement.h"

namespace kvtier::cli {
namespace {

struct PlanArgs {
  std::string model;
  std::string preset;
  std::string ctx;
  std::string chunk;  // empty: 10K for the paper's methods, the engine's default for the engine rows
  std::string device_mem;
  std::string host_mem;
  std::string policy = "all";
  uint32_t group = 0;
  uint32_t kv_bytes = 2;
  uint32_t act_bytes = 2;
  double peak_tflops = 0;  // compute rate for the roofline
  double link_gbps = 0;    // host <-> compute link, GB/s (1e9)
  double mem_gbps = 0;     // compute-local memory bandwidth, GB/s
  bool json = false;
  // Engine rows (-m only): the flags `kvtier run` takes.
  std::string kv_policies = "resident,layer,headinfer";
  policy::PolicyKnobs knobs;  // with -m: the approximate policies' knobs
  int threads = 0;
  std::string kv_type;  // empty: the policy's representation
  std::string kv_mem;
  std::string kv_disk;
  uint32_t prefetch_depth = 1;
  uint32_t static_heads = 0;
  std::string locret_heads;  // with -m: checked against the model when given; locret's KV needs none
  std::string weights_mem;   // with -m: weight budget (streamed layers), as for run
  policy::WeightSource weights_from = policy::WeightSource::kHost;
  bool no_layer_lanes = false;  // with -m: as for run
  std::string isa;              // with -m: the CPU kernel path, as for run (empty: the best)
};

policy::ModelShape shape_of(const PlanArgs& a, std::string& name) {
  policy::ModelShape m;
  if (!a.preset.empty()) {
    const auto p = model::find_preset(a.preset);
    if (!p) fail(ErrorKind::kInvalidArgument, "unknown preset '{}' (see kvtier synth --list)", a.preset);
    m = {p->n_layer, p->n_embd, p->n_ff, p->n_head, p->n_head_kv, p->head_dim, 0};
    m.weight_bytes = model::parameter_count(*p) * 2;  // bf16, as the papers measure
    name = std::string(p->name) + " (preset, bf16 weights)";
    return m;
  }
  const gguf::File f(a.model);
  const model::Hparams hp = model::read_hparams(f);
  uint64_t kv_heads = 0;
  for (uint32_t h : hp.n_head_kv) kv_heads += h;
  m.n_layer = hp.n_layer;
  m.n_embd = hp.n_embd;
  m.n_ff = hp.n_ff;
  m.n_head = hp.n_head;
  m.n_head_kv = static_cast<uint32_t>((kv_heads + hp.n_layer - 1) / hp.n_layer);
  m.head_dim = std::max(hp.head_dim_k, hp.head_dim_v);
  for (const auto& t : f.tensors()) m.weight_bytes += t.n_bytes;
  name = a.model + " (weights as stored)";
  if (!hp.uniform_kv_heads()) name += "; KV heads vary by layer, planned with their mean";
  return m;
}

int run_plan(const PlanArgs& a) {
  if (a.model.empty() == a.preset.empty())
    fail(ErrorKind::kInvalidArgument, "plan needs exactly one of -m or --preset");
  if (a.ctx.empty()) fail(ErrorKind::kInvalidArgument, "plan needs --ctx");
  std::string name;
  const policy::ModelShape m = shape_of(a, name);
  policy::PlanInputs in;
  in.n_ctx = parse_tokens(a.ctx, "--ctx");
  in.chunk = a.chunk.empty() ? 10240 : parse_tokens(a.chunk, "--chunk");
  if (in.chunk == 0) fail(ErrorKind::kInvalidArgument, "--chunk must be positive");
  in.kv_elem_bytes = a.kv_bytes;
  in.act_elem_bytes = a.act_bytes;
  in.group = a.group;
  if (!a.device_mem.empty()) in.device_budget = parse_bytes(a.device_mem, "--device-mem");
  if (!a.host_mem.empty()) in.host_budget = parse_bytes(a.host_mem, "--host-mem");

  std::vector<policy::Method> methods;
  if (a.policy == "all") {
    methods.assign(policy::all_methods().begin(), policy::all_methods().end());
  } else {
    const auto mm = policy::method_from_name(a.policy);
    if (!mm) {
      fail(ErrorKind::kInvalidArgument,
           "unknown --policy '{}' (standard, chunked, kvquant4, layer, headinfer, all)", a.policy);
    }
    methods.push_back(*mm);
  }

  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  if (!a.json) {
    std::cout << fmt::format(
        "model: {}\ncontext: {} tokens, chunk {}, KV {} B/elem, device budget {}, host budget {}\n\n", name,
        in.n_ctx, in.chunk, in.kv_elem_bytes, in.device_budget ? human_bytes(in.device_budget) : "unlimited",
        in.host_budget ? human_bytes(in.host_budget) : "unlimited");
    std::cout << fmt::format("{:<10} {:>3} {:>10} {:>10} {:>10} {:>10} {:>10} {:>5} {:>12}{}\n", "method",
                             "g", "weights", "KV(dev)", "activ.", "total(dev)", "KV(host)", "fits", "max ctx",
                             a.peak_tflops > 0 ? "   prefill s  decode s/tok" : "");
  }
  for (policy::Method method : methods) {
    const policy::MemoryPlan p = policy::plan_memory(m, method, in);
    const uint64_t max_ctx = policy::max_context(m, method, in);
    // Roofline (HeadInfer spec 4.2): prefill FLOPs ~ 2 P S + 2 S^2 H_q d_h L (causal attention);
    // offloaded methods also move KV over the link: S^2/(2C) x KV bytes per token for prefill, S x
    // KV bytes per token for each decoded token.
    double prefill_s = 0, decode_s = 0;
    const bool offload = method == policy::Method::kLayer || method == policy::Method::kHeadInfer;
    if (a.peak_tflops > 0) {
      const double S = static_cast<double>(in.n_ctx);
      const double params = static_cast<double>(m.weight_bytes) / a.act_bytes;
      const double flops = 2 * params * S + 2 * S * S * m.n_head * m.head_dim * m.n_layer;
      const double kv_tok = static_cast<double>(policy::kv_bytes_per_token(m, in.kv_elem_bytes));
      const double link = a.link_gbps > 0 ? a.link_gbps * 1e9 : 0;
      const double compute_s = flops / (a.peak_tflops * 1e12);
      const double move_s =
          offload && link > 0 ? kv_tok * S * S / (2.0 * static_cast<double>(in.chunk)) / link : 0;
      prefill_s = std::max(compute_s, move_s);
      // Decode reads the weights and the device-resident KV once per token; offloaded KV crosses the link.
      const double mem = a.mem_gbps > 0 ? a.mem_gbps * 1e9 : 0;
      const double read_s =
          mem > 0 ? static_cast<double>(m.weight_bytes + (offload ? 0 : p.device_kv)) / mem : 0;
      decode_s = std::max(read_s, offload && link > 0 ? kv_tok * S / link : 0.0);
    }
    nlohmann::ordered_json r;
    r["method"] = std::string(policy::method_name(method));
    r["group"] = p.group;
    r["device"] = {{"weights", p.device_weights},
                   {"kv", p.device_kv},
                   {"activations", p.device_activations},
                   {"total", p.device_total()}};
    r["host"] = {{"kv", p.host_kv}};
    r["total_kv"] = p.total_kv;
    r["fits"] = p.fits;
    r["max_context"] = max_ctx;
    if (a.peak_tflops > 0) r["roofline"] = {{"prefill_s", prefill_s}, {"decode_s_per_token", decode_s}};
    rows.push_back(r);
    if (!a.json) {
      std::cout << fmt::format("{:<10} {:>3} {:>9.2f}G {:>9.3f}G {:>9.3f}G {:>9.2f}G {:>9.2f}G {:>5} {:>12}",
                               r["method"].get<std::string>(), p.group ? std::to_string(p.group) : "-",
                               p.device_weights / gib, p.device_kv / gib, p.device_activations / gib,
                               p.device_total() / gib, p.host_kv / gib, p.fits ? "yes" : "NO",
                               max_ctx >= (uint64_t{1} << 40) ? "unbounded" : std::to_string(max_ctx));
      if (a.peak_tflops > 0) std::cout << fmt::format(" {:>11.2f} {:>10.4f}", prefill_s, decode_s);
      std::cout << "\n";
    }
  }
  if (!a.json) {
    std::cout << "\nG = GiB. Activations follow the paper's model (S*D + 2*S*I elements); KV(host) is the "
                 "offloaded master copy.\n";
  }
  nlohmann::ordered_json engine;
  if (!a.model.empty()) {
    EnginePlanArgs e;
    e.engine.model = a.model;
    e.engine.ctx = static_cast<int64_t>(in.n_ctx);
    e.engine.chunk = a.chunk.empty() ? 0 : static_cast<int64_t>(in.chunk);
    e.engine.threads = a.threads;
    e.engine.kv_type = a.kv_type;
    e.engine.kv_mem = a.kv_mem;
    e.engine.kv_disk = a.kv_disk;
    e.engine.host_mem = a.host_mem;
    e.engine.group = a.group;
    e.engine.prefetch_depth = a.prefetch_depth;
    e.engine.static_heads = a.static_heads;
    e.engine.knobs = a.knobs;
    e.engine.locret_heads = a.locret_heads;
    e.engine.weights_mem = a.weights_mem;
    e.engine.weights_from = a.weights_from;
    e.engine.no_layer_lanes = a.no_layer_lanes;
    cli::isa_flag(a.isa);  // the path decides which rows-in-lanes copies replace GGUF rows: it must run here
    e.engine.isa = a.isa;
    for (const policy::KvPolicy& p : kv_policy_list(e.engine, a.kv_policies)) e.policies.push_back(p);
    e.link_bytes_per_s = a.link_gbps * 1e9;
    engine = plan_engine(e, a.json);
  } else if (!a.json) {
    std::cout << "(engine rows need -m MODEL: they count the buffers this engine allocates for that file)\n";
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = name;
    j["n_ctx"] = in.n_ctx;
    j["chunk"] = in.chunk;
    j["device_budget"] = in.device_budget;
    j["host_budget"] = in.host_budget;
    j["methods"] = rows;
    if (!engine.is_null()) j["engine"] = engine;
    std::cout << j.dump(1) << "\n";
  }
  return 0;
}

}  // namespace

void add_plan(CLI::App& app, Runner& run) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd =
      app.add_subcommand("plan", "Predict memory per tier and the largest context of each KV placement");
  cmd->add_option("-m,--model", a->model, "GGUF model (weights counted as stored)");
  cmd->add_option("--preset", a->preset, "Preset shape instead of a file (bf16 weights), e.g. llama3-8b");
  cmd->add_option("--ctx", a->ctx, "Context length in tokens (K = 1024, M = 1024^2), e.g. 1M")->required();
  cmd->add_option("--chunk", a->chunk,
                  "Prefill chunk (default: 10K for the paper's chunked methods; the engine rows use run's "
                  "default)");
  cmd->add_option("--device-mem", a->device_mem,
                  "Compute-local memory budget, e.g. 24GiB (default: unlimited)");
  cmd->add_option("--host-mem", a->host_mem, "Host memory budget for offloaded KV, e.g. 512GiB");
  cmd->add_option("--policy", a->policy, "standard, chunked, kvquant4, layer, headinfer or all")
      ->capture_default_str();
  cmd->add_option("--group", a->group, "HeadInfer KV heads per unit (0: adaptive)")->capture_default_str();
  cmd->add_option("--kv-bytes", a->kv_bytes, "Bytes per KV element")->capture_default_str();
  cmd->add_option("--act-bytes", a->act_bytes, "Bytes per activation element")->capture_default_str();
  cmd->add_option("--peak-tflops", a->peak_tflops, "Compute rate for a roofline time estimate (TFLOP/s)");
  cmd->add_option("--link-gbps", a->link_gbps,
                  "Host-to-compute link bandwidth for the estimate (GB/s); with -m, also the throttle the "
                  "engine rows' predicted KV phase (kvpr, hybridserve, KIVI) is profiled at");
  cmd->add_option("--mem-gbps", a->mem_gbps, "Compute-local memory bandwidth for the decode estimate (GB/s)");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  // The engine rows (with -m): the same flags as `kvtier run`.
  cmd->add_option("--kv-policy", a->kv_policies,
                  "With -m: engine placements to size, comma-separated (resident, layer, headinfer, with "
                  "their retentions, e.g. locret, layer+locret)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "With -m: worker threads, as for run (default: all cores)")
      ->check(non_negative());
  cmd->add_option("--kv-type", a->kv_type, "With -m: KV cache element type")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--kv-mem", a->kv_mem, "With -m: compute-local KV budget, as for run (default: as needed)");
  cmd->add_option("--kv-disk", a->kv_disk, "With -m: offloaded KV home on disk (counted in the disk tier)");
  cmd->add_option("--prefetch-depth", a->prefetch_depth, "With -m: offloaded policies: units loaded ahead")
      ->check(CLI::Range(1u, 64u))
      ->capture_default_str();
  cmd->add_option("--static-heads", a->static_heads, "With -m: headinfer: KV heads kept resident")
      ->capture_default_str();
  cmd->add_option("--weights-mem", a->weights_mem,
                  "With -m: compute-local memory for weights, as for run (streamed layers: host or disk "
                  "weights, two staging slots)");
  cmd->add_option("--weights-from", a->weights_from, "With -m: streamed layers' home: host or file")
      ->transform(CLI::CheckedTransformer(std::map<std::string, policy::WeightSource>{
          {"host", policy::WeightSource::kHost}, {"file", policy::WeightSource::kFile}}))
      ->default_str("host");
  cmd->add_flag("--no-layer-lanes", a->no_layer_lanes,
                "With -m: without the rows-in-lanes copies of the layers' matrices, as for run");
  cmd->add_option(
         "--isa", a->isa,
         "With -m: the CPU kernel path, as for run (default: the best the CPU has); it decides which "
         "rows-in-lanes copies replace GGUF rows and which cost their bytes again")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  add_knob_flags(cmd, a->knobs);
  cmd->add_option("--locret-heads", a->locret_heads,
                  "With -m: locret's retaining heads, as for run (checked against the model); not needed: "
                  "locret's KV (--kv-budget + --local-tail + --chunk rows per layer and KV head) does not "
                  "depend on the heads");
  cmd->callback([a, &run] { run = [a] { return run_plan(*a); }; });
}

}  // namespace kvtier::cli
