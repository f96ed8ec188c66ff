#include "runtime/kv_phase_predict.h"

#include <algorithm>
#include <limits>

#include "model/forward.h"
#include "policy/hybrid_plan.h"
#include "policy/kvpr_schedule.h"

namespace kvtier::runtime {

double KvPhasePrediction::tokens_per_s_bound() const {
  return step_s > 0 ? 1.0 / step_s : std::numeric_limits<double>::infinity();
}

std::optional<KvPhasePrediction> predict_kv_phase(const LoadedModel& model, const SessionOptions& o,
                                                  const Profile& profile) {
  const kv::KvOptions& ko = o.kv_placement;
  if (ko.placement.placement == policy::Placement::kResident || policy::is_kivi(ko.representation))
    return std::nullopt;
  const auto& cfg = model.config;
  const kv::KvGeometry geo = model::kv_geometry(cfg, o.kv_block_tokens, o.kv_dtype);
  const double b = ko.max_seqs;  // sequences in the step
  policy::KvprCosts c = kvpr_costs(profile, !ko.disk_dir.empty());
  // The profile's per-token sizes are layer 0's, in f16; scale the K/V rows to this dtype.
  const double kv_row = c.kv_bytes * static_cast<double>(cpu::kv_dtype_bytes(o.kv_dtype)) / 2.0;
  c.kv_bytes = kv_row * b;
  c.x_bytes *= b;
  c.recompute_flops *= b;
  c.hidden_s = 0;
  KvPhasePrediction p;
  p.context = o.n_ctx;
  // Rows each layer's visit loads at s': a layer with a window of its own only the window where the
  // retention drops what it cannot see (`+sliding`, or streaming, which leaves such layers to their
  // window: TieredKv::first_row); without it the engine keeps and loads every row.
  const bool windowed =
      ko.retention == policy::Retention::kSliding || ko.retention == policy::Retention::kStreaming;
  auto rows = [&](uint32_t l) {
    const int64_t w = windowed ? geo.window_of(l) : 0;
    return w > 0 ? std::min<int64_t>(o.n_ctx, w) : o.n_ctx;
  };
  for (uint32_t l = 0; l < geo.n_layer(); ++l)
    p.offload_s += static_cast<double>(rows(l)) * c.kv_bytes / c.v_com_kv;
  switch (ko.representation) {
    case policy::Representation::kKvpr: {
      for (uint32_t l = 0; l < geo.n_layer(); ++l) {
        const policy::KvprDecision d =
            policy::kvpr_decide(c, policy::KvprSchedule::kPipelined, rows(l), rows(l));
        p.step_s += d.at_l.total;
        if (l == 0) p.split = d.l;
      }
      break;
    }
    case policy::Representation::kHybrid: {
      // Algorithm 1 as TieredKv::hybrid_ratio runs it (the home sized for s').
      const int64_t bt = geo.block_tokens;
      const int64_t blocks = (o.n_ctx + bt - 1) / bt;
      const policy::HostAllocInput in = policy::engine_alloc_input(
          kv_row * geo.n_layer(), profile.x_bytes_per_token * geo.n_layer(), geo.n_layer(), bt,
          static_cast<double>(blocks) * b, c.v_com_kv, profile.proj_tokens_per_s, 0.0);
      const policy::HostAllocResult r = policy::host_block_allocation(in);
      const double ratio = ko.knobs.act_ratio >= 0 ? ko.knobs.act_ratio : r.ratio;
      p.act_ratio = ratio;
      // The per-layer time at this ratio's split of the blocks the layer visits (Eq. 11's counts): all
      // of the context's, or for a sliding layer those its window reaches at s' (blocks keep their
      // type by index, block_type_at, so those are the ACT blocks among the last ones).
      const auto nb = static_cast<int64_t>(b);
      for (uint32_t l = 0; l < geo.n_layer(); ++l) {
        int64_t act = 0, kvb = 0;
        if (rows(l) < o.n_ctx) {
          const int64_t hi = blocks, lo = std::max<int64_t>(0, (o.n_ctx - rows(l)) / bt);
          act = (policy::act_blocks_of(ratio, hi) - policy::act_blocks_of(ratio, lo)) * nb;
          kvb = (hi - lo) * nb - act;
        } else {
          act = policy::act_blocks_of(ratio, blocks * nb);
          kvb = blocks * nb - act;
        }
        p.step_s += std::max(policy::hybrid_t_pcie(in, act, kvb), policy::hybrid_t_comp(in, act));
      }
      break;
    }
    default:
      p.step_s = p.offload_s;
      break;
  }
  return p;
}

}  // namespace kvtier::runtime
