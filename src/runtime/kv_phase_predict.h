// The predicted KV phase of one decode step of an offloaded placement at its full context, from the
// profiled rates (runtime/profiler.h: the home link and the K/V projection rate), for `kvtier plan`:
//
//   offload (f16/f32 rows):  per layer  s' · kv_bytes / v_link                     (every row crosses)
//   kvpr:                    per layer  the scheduler's pipelined step at its split (policy/kvpr_schedule.h,
//                                       no other compute assumed to hide the transfer; a forced
//                                       --recompute N: at min(N, s'))
//   hybrid:                  per layer  max(T_pcie, T_comp) of Algorithm 1's block allocation
//                                       (policy/hybrid_plan.h), as the engine's --act-ratio auto picks it,
//                                       over the blocks the layer visits
//   kivi4/kivi2:             per layer  bytes / v_link, bytes = every head's quantised pages of the rows
//                                       below q_end = policy::kivi_quantised_end(s', residual, group)
//                                       (whole pages, kv/page_extents.h: what TieredKv reads) + the f16
//                                       rows [q_end, s')
//   kivi4/kivi2+kvpr:        per unit   max(l · share / proj_rate, bytes / v_link) at the split l that
//                                       policy::kvpr_kivi_visit_split picks over the quantised rows (whole
//                                       key groups; W = 0; a forced --recompute N: min(N, q_end) rounded
//                                       down to a group), bytes = the inputs of [0, l) + the quantised
//                                       pages from l on + the f16 rows. A unit is the layer (`layer`) or
//                                       --group heads (`headinfer`; adaptive groups counted as the layer)
//
// A layer with a window of its own (Gemma-3's local layers) counts only its window where the retention
// drops the rest (`+sliding`, streaming), as the engine loads it; otherwise the whole context.
//
// step_bytes counts what TieredKv's loads read from the home for the step (its transfer stats'
// bytes_loaded): rows rounded out to the home's I/O alignment (a disk home: direct I/O's 4 KiB), KIVI's
// quantised pages whole, the inputs of a recomputed prefix; not the one I/O page around the new row's
// input that kvpr also reads on a disk home, nor hybrid (not given there). headinfer's --static-heads
// (compute-local, never loaded) are counted as crossing, in the bytes as in the times.
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
  double step_s = 0;           // the policy's KV phase of one decode step (all layers, all sequences)
  double offload_s = 0;        // the same with every row over the link (the `layer` placement's)
  int64_t context = 0;         // s'
  int64_t split = -1;          // kvpr, kivi+kvpr: the split l at s' (rows recomputed by layer 0's first unit)
  double act_ratio = -1;       // hybrid: R = ACT / KV blocks (+inf: every block ACT)
  int64_t step_bytes = -1;     // bytes the step reads over the home link (-1: not given, hybrid)
  int64_t offload_bytes = 0;   // the same with every row over the link in the KV dtype (`layer`'s)
  int64_t quantised_end = -1;  // kivi: q_end at s' (rows below it are quantised pages)
  double tokens_per_s_bound() const;
};

// Nothing for the resident placement (no link). `profile` holds the rates for o's home tier.
std::optional<KvPhasePrediction> predict_kv_phase(const LoadedModel& model, const SessionOptions& o,
                                                  const Profile& profile);

}  // namespace kvtier::runtime
