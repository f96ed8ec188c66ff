#include "cmd_plan_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>

#include "cli_util.h"
#include "core/error.h"
#include "kv/locret_kv.h"
#include "runtime/kv_phase_predict.h"
#include "runtime/model_files.h"
#include "runtime/profile_cache.h"
#include "runtime/session.h"

namespace kvtier::cli {

nlohmann::ordered_json plan_engine(const EnginePlanArgs& a, bool json) {
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  runtime::SessionOptions first;
  // kvpr and hybrid rows weigh the home link against recomputation, KIVI rows move fewer bytes over it:
  // with one of them asked for, every offloaded row gets its predicted KV phase from the profile
  // (measured and cached on first use, as `kvtier run` does).
  const bool predict = std::any_of(a.policies.begin(), a.policies.end(), [](const policy::KvPolicy& p) {
    return p.placement != policy::Placement::kResident &&
           (policy::stores_inputs(p.representation) || policy::is_kivi(p.representation));
  });
  std::optional<runtime::Profile> prof;
  for (size_t i = 0; i < a.policies.size(); ++i) {
    const EngineArgs e = engine_for(a.engine, a.policies[i]);
    const runtime::SessionOptions o = runtime::resolve_session_options(
        model->config, session_options(e, model->config, e.ctx, LocretHeads::kIfGiven));
    if (i == 0) first = o;
    nlohmann::ordered_json r;
    r["policy"] = e.kv_policy;
    r["group"] = a.policies[i].placement == policy::Placement::kHeadInfer
                     ? e.group
                     : 0;  // 0: all heads (layer), adaptive (headinfer)
    if (o.kv_placement.retention == policy::Retention::kLocret) {
      // The rows locret keeps per (sequence, layer, KV head), whatever the context: b + n_loc + B.
      r["locret_rows"] = kv::locret_rows(o.n_ctx, o.kv_placement);
      r["locret_heads"] = o.kv_placement.scorer ? "checked" : "not given (not needed for memory)";
    }
    try {
      const kv::MemoryLedger p = runtime::predict_memory(*model, o);
      r["fits"] = true;
      r["memory"] = memory_json(p);
      if (predict && o.kv_placement.placement.placement != policy::Placement::kResident) {
        if (!prof) {  // one profile for every row: the same model, threads, home tier and link
          runtime::ProfileOptions po;
          po.threads = o.threads;
          po.isa = o.isa.value_or(cpu::best_isa());
          po.disk_dir = o.kv_placement.disk_dir;
          po.link_bytes_per_s = a.link_bytes_per_s;
          prof = runtime::get_profile(profile_cache_path(a.engine.profile_cache), *model, po).profile;
        }
        if (const auto kp = runtime::predict_kv_phase(*model, o, *prof)) {
          nlohmann::ordered_json k;
          k["context"] = kp->context;
          k["sequences"] = o.kv_placement.max_seqs;
          k["link_bytes_per_s"] =
              o.kv_placement.disk_dir.empty() ? prof->host.bytes_per_s : prof->disk->bytes_per_s;
          k["recompute_tokens_per_s"] = prof->proj_tokens_per_s;
          k["kv_bytes_per_token_layer"] = prof->kv_bytes_per_token;  // f16 rows, layer 0
          k["x_bytes_per_token_layer"] = prof->x_bytes_per_token;
          k["step_s"] = kp->step_s;
          k["offload_step_s"] = kp->offload_s;
          if (kp->step_bytes >= 0) k["step_bytes"] = kp->step_bytes;  // read from the home in the step
          k["offload_step_bytes"] = kp->offload_bytes;
          if (kp->quantised_end >= 0) k["quantised_end"] = kp->quantised_end;
          k["tokens_per_s_bound"] = kp->tokens_per_s_bound() * o.kv_placement.max_seqs;
          if (kp->split >= 0) k["split"] = kp->split;
          if (kp->act_ratio >= 0) {
            if (std::isinf(kp->act_ratio))
              k["act_ratio"] = "inf";
            else
              k["act_ratio"] = kp->act_ratio;
          }
          r["predicted_kv_phase"] = k;
        }
      }
    } catch (const Error& err) {
      if (err.kind() != ErrorKind::kBudget) throw;
      r["fits"] = false;
      r["error"] = err.what();
    }
    rows.push_back(r);
  }
  nlohmann::ordered_json j;
  j["ctx"] = first.n_ctx;
  j["chunk"] = first.chunk;
  j["threads"] = first.threads;
  j["kv_mem"] = first.kv_placement.kv_mem;
  j["policies"] = rows;
  if (json) return j;

  const double mib = 1024.0 * 1024.0;
  std::cout << fmt::format(
      "\nengine: what `kvtier run` allocates with these flags (ctx {}, chunk {}, {} threads, --kv-mem {}; "
      "MiB):\n",
      first.n_ctx, first.chunk, first.threads,
      first.kv_placement.kv_mem ? human_bytes(first.kv_placement.kv_mem) : "as needed");
  size_t w = 10;  // the policy column fits the longest spec
  for (const auto& p : a.policies) w = std::max(w, p.spec().size());
  std::cout << fmt::format("{:<{}} {:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}\n", "policy",
                           w, "g", "weights", "KV(dev)", "activ.", "staging", "scratch", "logits",
                           "total(dev)", "KV(host)", "KV(disk)");
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const policy::Placement pl = a.policies[i].placement;
    const std::string g = pl == policy::Placement::kResident ? "-"
                          : pl == policy::Placement::kLayer  ? "all"
                          : r["group"] == 0                  ? "auto"
                                                             : r["group"].dump();
    if (!r["fits"].get<bool>()) {
      std::cout << fmt::format("{:<{}} {:>4} does not fit: {}\n", r["policy"].get<std::string>(), w, g,
                               r["error"].get<std::string>());
      continue;
    }
    const auto& d = r["memory"]["device"];
    auto m = [&](const nlohmann::json& v) { return v.get<uint64_t>() / mib; };
    std::cout << fmt::format(
        "{:<{}} {:>4} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>10.2f} {:>9.2f} {:>9.2f}\n",
        r["policy"].get<std::string>(), w, g, m(d["weights"]), m(d["kv"]), m(d["activations"]),
        m(d["staging"]), m(d["scratch"]), m(d["logits"]), m(d["total"]), m(r["memory"]["host"]["kv"]),
        m(r["memory"]["disk"]["kv"]));
    if (r.contains("locret_rows")) {
      std::cout << fmt::format(
          "{:<{}} {:>4} locret: {} rows per (sequence, layer, KV head) (budget + tail + chunk), any context; "
          "heads {}\n",
          "", w, "", r["locret_rows"].get<int64_t>(), r["locret_heads"].get<std::string>());
    }
    if (r.contains("predicted_kv_phase")) {
      const auto& k = r["predicted_kv_phase"];
      std::string what;
      if (k.contains("split"))
        what = fmt::format(", split {} of {}", k["split"].get<int64_t>(), k["context"].get<int64_t>());
      if (k.contains("act_ratio"))
        what =
            ", ACT:KV " + (k["act_ratio"].is_string() ? std::string("inf")
                                                      : fmt::format("{:.3g}", k["act_ratio"].get<double>()));
      if (k.contains("quantised_end"))
        what += fmt::format(", {} rows quantised", k["quantised_end"].get<int64_t>());
      std::string bytes;
      if (k.contains("step_bytes")) bytes = fmt::format(", {:.2f} MiB", k["step_bytes"].get<int64_t>() / mib);
      std::cout << fmt::format(
          "{:<{}} {:>4} predicted KV phase per decode step at {} tokens: {:.2f} ms{} (all rows over the "
          "link: "
          "{:.2f} ms, {:.2f} MiB){}; at most {:.1f} tok/s from the KV phase\n",
          "", w, "", k["context"].get<int64_t>(), 1e3 * k["step_s"].get<double>(), bytes,
          1e3 * k["offload_step_s"].get<double>(), k["offload_step_bytes"].get<int64_t>() / mib, what,
          k["tokens_per_s_bound"].get<double>());
    }
    const auto& hw = r["memory"]["host"]["weights"];
    const auto& dw = r["memory"]["disk"]["weights"];
    if (hw.get<uint64_t>() + dw.get<uint64_t>() > 0) {
      std::cout << fmt::format(
          "{:<{}} {:>4} streamed weights: {:.2f} MiB in host memory, {:.2f} MiB read from the file\n", "", w,
          "", m(hw), m(dw));
    }
  }
  return j;
}

}  // namespace kvtier::cli
