#include "policy/weight_plan.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier::policy {

WeightPlan plan_weights(const WeightPlanInput& in) {
  KVTIER_ASSERT(in.layer_bytes.size() == in.stage_bytes.size(), "{} layers, {} staging sizes",
                in.layer_bytes.size(), in.stage_bytes.size());
  const auto n = static_cast<uint32_t>(in.layer_bytes.size());
  uint64_t all = in.fixed_bytes;
  for (uint64_t b : in.layer_bytes) all += b;
  if (in.budget == 0 || all <= in.budget) {
    WeightPlan p;
    p.resident_layers = n;
    p.resident_bytes = all;
    return p;
  }
  // prefix[k] = fixed + layers [0, k); max_stage[k] = the largest slot of layers [k, n).
  std::vector<uint64_t> max_stage(n + 1, 0);
  for (uint32_t l = n; l-- > 0;) max_stage[l] = std::max(max_stage[l + 1], in.stage_bytes[l]);
  uint64_t prefix = in.fixed_bytes;
  WeightPlan best;
  bool found = false;
  for (uint32_t k = 0; k < n; ++k) {
    const uint64_t need = prefix + 2 * max_stage[k];
    if (need <= in.budget) {
      best.resident_layers = k;
      best.resident_bytes = prefix;
      best.staging_bytes = 2 * max_stage[k];
      found = true;
    }
    prefix += in.layer_bytes[k];
  }
  if (!found) {
    fail(ErrorKind::kBudget,
         "--weights-mem {} bytes cannot hold the weights outside the layers ({} bytes) and two staging "
         "buffers of the largest layer ({} bytes each): {} bytes are needed at least",
         in.budget, in.fixed_bytes, max_stage[0], in.fixed_bytes + 2 * max_stage[0]);
  }
  best.streamed_bytes = all - best.resident_bytes;
  return best;
}

}  // namespace kvtier::policy
