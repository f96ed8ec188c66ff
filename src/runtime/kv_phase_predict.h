// The predicted KV phase of one decode step of an offloaded placement at its full context, from the
// profiled rates (runtime/profiler.h: the home link and the K/V projection rate), for `kvtier plan`:
//
//   offload (f16/f32 rows):  per layer  s' · kv_bytes / v_link                     (every row crosses)
//   kvpr:                    per layer  the scheduler's pipelined step at its split (policy/kvpr_schedule.h,
//                                       no other compute assumed to hide the transfer)
//   hybrid:                  per layer  max(T_pcie, T_comp) of Algorithm 1's block allocation
//                                       (policy/hybrid_plan.h), as the engine's --act-ratio auto picks it,
//                                       over the blocks the layer visits
//
// A layer with a window of its own (Gemma-3's local layers) counts only its window where the retention
// drops the rest (`+sliding`, streaming), as the engine loads it; otherwise the whole context.
//
// times n_layer, for max_seqs sequences of s' = n_ctx tokens. The weights' own streaming and the
// layers' other compute are not in it, so batch / step is an upper bound on decode tokens per second
// that the KV phase alone allows.
#pragma once

#include <optional>
#include <string>

#include "runtime/model_files.h"
#include "runtime/profiler.h"
#include "runtime/session.h"

namespace kvtier::runtime {

struct KvPhasePrediction {
  double step_s = 0;      // the policy's KV phase of one decode step (all layers, all sequences)
  double offload_s = 0;   // the same with every row over the link (the `layer` placement's)
  int64_t context = 0;    // s'
  int64_t split = -1;     // kvpr: the split l at s' (tokens recomputed per layer)
  double act_ratio = -1;  // hybrid: R = ACT / KV blocks (+inf: every block ACT)
  double tokens_per_s_bound() const;
};

// Nothing for the resident placement (no link), nor for KIVI rows (quantised pages and f16 residual rows
// with their own sizes: not modelled here). `profile` holds the rates for o's home tier.
std::optional<KvPhasePrediction> predict_kv_phase(const LoadedModel& model, const SessionOptions& o,
                                                  const Profile& profile);

}  // namespace kvtier::runtime
