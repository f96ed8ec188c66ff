#include "kv/cuda/stream_plan.h"

namespace kvtier::kv_cuda {
namespace {

struct Emitter {
  std::vector<StreamOp>& out;
  uint32_t layer = kBeginOps;

  void wait(StreamId s, EventKind k, uint32_t i) { out.push_back({OpKind::kWait, s, {k, i}, 0, 0, layer}); }
  void record(StreamId s, EventKind k, uint32_t i) {
    out.push_back({OpKind::kRecord, s, {k, i}, 0, 0, layer});
  }
  void data(OpKind kind, StreamId s, uint32_t unit, uint32_t slot) {
    out.push_back({kind, s, {}, unit, slot, layer});
  }
};

void prefetch(Emitter& e, const policy::PassPlan& plan, uint32_t unit, uint32_t slot, int64_t pos0) {
  e.wait(StreamId::kH2D, EventKind::kComputed, slot);
  e.wait(StreamId::kH2D, EventKind::kStored, slot);
  e.wait(StreamId::kH2D, EventKind::kLayerStored, plan.units[unit].layer);
  if (pos0 > 0) e.data(OpKind::kLoad, StreamId::kH2D, unit, slot);
  e.record(StreamId::kH2D, EventKind::kLoaded, slot);  // recorded even without a copy
}

}  // namespace

void plan_stream_ops(const policy::PassPlan& plan, int64_t pos0, std::vector<StreamOp>& out) {
  out.clear();
  Emitter e{out};
  const auto n_units = static_cast<uint32_t>(plan.units.size());
  // The offloaded units in schedule order; the k-th one uses slot k % 2.
  auto next_offloaded = [&](uint32_t from) {
    while (from < n_units && plan.units[from].is_static) ++from;
    return from;
  };
  // The slots may be re-sliced for another group: wait for every earlier user of both.
  for (uint32_t s = 0; s < 2; ++s) {
    e.wait(StreamId::kH2D, EventKind::kComputed, s);
    e.wait(StreamId::kH2D, EventKind::kStored, s);
  }
  uint32_t k = 0;  // offloaded units seen
  if (const uint32_t first = next_offloaded(0); first < n_units) prefetch(e, plan, first, 0, pos0);
  for (uint32_t u = 0; u < n_units; ++u) {
    const uint32_t l = plan.units[u].layer;
    e.layer = l;
    if (plan.units[u].is_static) {
      e.data(OpKind::kAppend, StreamId::kCompute, u, kStaticSlot);
      e.data(OpKind::kAttend, StreamId::kCompute, u, kStaticSlot);
      continue;
    }
    const uint32_t x = k++ % 2;
    e.wait(StreamId::kCompute, EventKind::kLoaded, x);
    e.data(OpKind::kAppend, StreamId::kCompute, u, x);
    e.record(StreamId::kCompute, EventKind::kAppended, x);
    e.wait(StreamId::kD2H, EventKind::kAppended, x);
    e.data(OpKind::kStore, StreamId::kD2H, u, x);
    e.record(StreamId::kD2H, EventKind::kStored, x);
    const uint32_t next = next_offloaded(u + 1);
    if (next == n_units || plan.units[next].layer != l) e.record(StreamId::kD2H, EventKind::kLayerStored, l);
    if (next < n_units) prefetch(e, plan, next, 1 - x, pos0);
    e.data(OpKind::kAttend, StreamId::kCompute, u, x);
    e.record(StreamId::kCompute, EventKind::kComputed, x);
  }
}

}  // namespace kvtier::kv_cuda
