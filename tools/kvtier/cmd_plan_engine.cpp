#include "cmd_plan_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

#include "cli_util.h"
#include "core/error.h"
#include "runtime/model_files.h"
#include "runtime/session.h"

namespace kvtier::cli {

nlohmann::ordered_json plan_engine(const EnginePlanArgs& a, bool json) {
  const auto model = runtime::load_model(a.engine.model);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  runtime::SessionOptions first;
  for (size_t i = 0; i < a.policies.size(); ++i) {
    const EngineArgs e = engine_for(a.engine, a.policies[i]);
    const runtime::SessionOptions o =
        runtime::resolve_session_options(model->config, session_options(e, model->config, e.ctx));
    if (i == 0) first = o;
    nlohmann::ordered_json r;
    r["policy"] = e.kv_policy;
    r["group"] = a.policies[i].placement == policy::Placement::kHeadInfer
                     ? e.group
                     : 0;  // 0: all heads (layer), adaptive (headinfer)
    try {
      const kv::MemoryLedger p = runtime::predict_memory(*model, o);
      r["fits"] = true;
      r["memory"] = memory_json(p);
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
