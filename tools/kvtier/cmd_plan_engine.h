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
};

// {"ctx": N, "chunk": N, "threads": N, "kv_mem": B, "policies": [{"policy", "group", "fits",
//  "memory": {tier: {category: B, "total": B}}} | {"policy", "fits": false, "error": "..."}]}
// Prints a table to stdout unless `json`.
nlohmann::ordered_json plan_engine(const EnginePlanArgs& a, bool json);

}  // namespace kvtier::cli
