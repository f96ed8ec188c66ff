// The engine part of `kvtier plan -m MODEL`: for each KV placement, the bytes per tier and category
// that `kvtier run` with the same flags reserves (runtime::predict_memory: the sizes the session's
// buffers are allocated with, so measured peaks equal these).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_common.h"

namespace kvtier::cli {

struct EnginePlanArgs {
  EngineArgs engine;  // model, ctx, chunk (0: the engine's default), threads, KV flags
  std::vector<policy::KvPolicy> policies;
  // kvpr/hybrid rows: the home link the predicted KV phase is profiled at (plan's --link-gbps; 0: as
  // measured, unthrottled).
  double link_bytes_per_s = 0;
};

// {"ctx": N, "chunk": N, "threads": N, "kv_mem": B, "policies": [{"policy", "group", locret rows:
//  "locret_rows" (kept per sequence, layer and KV head) and "locret_heads" (checked or not given), "fits",
//  "memory": {tier: {category: B, "total": B}}, offloaded rows when a kvpr or hybrid row is asked for:
//  "predicted_kv_phase": {"context", "sequences", "link_bytes_per_s", "recompute_tokens_per_s",
//  "kv_bytes_per_token_layer", "x_bytes_per_token_layer", "step_s", "offload_step_s", "tokens_per_s_bound",
//  kvpr: "split", hybrid: "act_ratio"}} | {"policy", "fits": false, "error": "..."}]}
// Prints a table to stdout unless `json`.
nlohmann::ordered_json plan_engine(const EnginePlanArgs& a, bool json);

}  // namespace kvtier::cli
