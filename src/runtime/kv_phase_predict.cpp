#include "runtime/kv_phase_predict.h"

#include <algorithm>
#include <limits>

#include "kv/footprint.h"
#include "kv/page_extents.h"
#include "model/forward.h"
#include "policy/hybrid_plan.h"
#include "policy/kivi.h"
#include "policy/kvpr_schedule.h"
#include "policy/retention.h"

namespace kvtier::runtime {

double KvPhasePrediction::tokens_per_s_bound() const {
  return step_s > 0 ? 1.0 / step_s : std::numeric_limits<double>::infinity();
}

std::optional<KvPhasePrediction> predict_kv_phase(const LoadedModel& model, const SessionOptions& o,
                                                  const Profile& profile) {
  const kv::KvOptions& ko = o.kv_placement;
  if (ko.placement.placement == policy::Placement::kResident) return std::nullopt;
  const kv::KvGeometry geo = kv_geometry(model, o);
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
  // The bytes a visit reads (kv/page_extents.h, as TieredKv's loads): from the engine's first row (a
  // windowed layer's block-aligned window start) to s', in the home's I/O alignment.
  const uint64_t align = ko.disk_dir.empty() ? 1 : kv::kDirectIoAlign;
  const uint64_t esz = cpu::kv_dtype_bytes(geo.dtype);
  const int64_t bt = geo.block_tokens;
  auto first_row = [&](uint32_t l) {
    const int64_t w = windowed ? geo.window_of(l) : 0;
    return w > 0 ? std::min<int64_t>(o.n_ctx, policy::sliding_first_block(o.n_ctx, w, bt) * bt) : 0;
  };
  // f16 rows [r0, r1) of `heads` heads, K and V planes
  auto kv_rows_bytes = [&](int64_t r0, int64_t r1, uint32_t heads) {
    return heads * (kv::rows_load_bytes(r0, r1, bt, geo.head_dim_k * esz, align) +
                    kv::rows_load_bytes(r0, r1, bt, geo.head_dim_v * esz, align));
  };
  auto x_rows_bytes = [&](uint32_t l, int64_t r0, int64_t r1) {
    return geo.act_row_bytes.empty() ? 0 : kv::rows_load_bytes(r0, r1, bt, geo.act_row_bytes[l], align);
  };
  const auto nb = static_cast<int64_t>(b);
  p.offload_bytes = 0;
  for (uint32_t l = 0; l < geo.n_layer(); ++l) {
    p.offload_s += static_cast<double>(rows(l)) * c.kv_bytes / c.v_com_kv;
    p.offload_bytes += nb * static_cast<int64_t>(kv_rows_bytes(first_row(l), o.n_ctx, geo.n_head_kv[l]));
  }
  const int64_t forced = ko.knobs.recompute;  // >= 0: --recompute N
  switch (ko.representation) {
    case policy::Representation::kKvpr: {
      p.step_bytes = 0;
      for (uint32_t l = 0; l < geo.n_layer(); ++l) {
        const policy::KvprDecision d =
            policy::kvpr_decide(c, policy::KvprSchedule::kPipelined, rows(l), rows(l));
        const int64_t split = forced >= 0 ? std::min(forced, rows(l)) : d.l;
        p.step_s += forced >= 0
                        ? policy::kvpr_step_time(c, policy::KvprSchedule::kPipelined, rows(l), split).total
                        : d.at_l.total;
        if (l == 0) p.split = split;
        const int64_t f = first_row(l), x = std::min(o.n_ctx, f + split);
        p.step_bytes +=
            nb * static_cast<int64_t>(x_rows_bytes(l, f, x) + kv_rows_bytes(x, o.n_ctx, geo.n_head_kv[l]));
      }
      break;
    }
    case policy::Representation::kKivi4:
    case policy::Representation::kKivi2:
    case policy::Representation::kKivi4Kvpr:
    case policy::Representation::kKivi2Kvpr: {
      // TieredKv::submit_load with KIVI: the quantised pages of [first + l, q_end), the f16 rows of
      // [max(first + l, q_end), s'), and with kvpr the inputs of [first, first + l); l from the unit's
      // costs as TieredKv::split_rows / kivi_split weigh them (W = 0 here, as for kvpr above).
      const cpu::KiviFormat kf = kv::kivi_format_of(geo, ko);
      const kv::QpageSize qs = kv::kivi_qpage_size(kf, geo);
      const int64_t G = kf.key_group;
      const int64_t s = o.n_ctx;
      const bool recomputes = policy::stores_inputs(ko.representation);
      p.quantised_end = policy::kivi_quantised_end(s, ko.knobs.kivi_residual, G);
      p.step_bytes = 0;
      for (uint32_t l = 0; l < geo.n_layer(); ++l) {
        const uint32_t H = geo.n_head_kv[l];
        const int64_t first = std::min(first_row(l), s);
        const int64_t qend = std::max(first, p.quantised_end);
        const uint32_t g = ko.placement.placement == policy::Placement::kHeadInfer && ko.placement.group > 0
                               ? std::min(ko.placement.group, H)
                               : H;
        for (uint32_t h0 = 0; h0 < H; h0 += g) {
          const uint32_t n = std::min(g, H - h0);  // the unit's heads
          int64_t split = 0;
          if (recomputes) {
            const int64_t visible = std::clamp<int64_t>(qend - first, 0, s - first) / G * G;
            if (forced >= 0) {
              split = std::min(forced, visible) / G * G;
            } else {
              policy::KvprCosts u;
              u.x_bytes = static_cast<double>(geo.act_row_bytes.at(l));
              u.kv_bytes = static_cast<double>(n * (geo.head_dim_k + geo.head_dim_v) * esz);
              u.recompute_flops = static_cast<double>(n) / H;  // of the layer's projections
              u.v_com_x = u.v_com_kv = c.v_com_kv;
              u.v_gpu = profile.proj_tokens_per_s;
              u.hidden_s = 0;
              policy::KvprCosts uq = u;
              uq.kv_bytes = static_cast<double>(n * qs.bytes) / static_cast<double>(bt);
              const double f16_s = static_cast<double>(s - qend) * u.kv_bytes / u.v_com_kv;
              split = policy::kvpr_kivi_visit_split(uq, qend - first, f16_s, visible, G);
            }
          }
          const int64_t x = first + split;
          const uint64_t bytes = x_rows_bytes(l, first, x) +
                                 n * kv::qgroups_load_bytes(kf, geo, qs, x, qend, align) +
                                 kv_rows_bytes(std::max(x, qend), s, n);
          const double recompute_s =
              static_cast<double>(split) * (static_cast<double>(n) / H) / profile.proj_tokens_per_s;
          p.step_s += b * std::max(recompute_s, static_cast<double>(bytes) / c.v_com_kv);
          p.step_bytes += nb * static_cast<int64_t>(bytes);
          if (l == 0 && h0 == 0 && recomputes) p.split = split;
        }
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
      p.step_bytes = p.offload_bytes;
      break;
  }
  return p;
}

}  // namespace kvtier::runtime
