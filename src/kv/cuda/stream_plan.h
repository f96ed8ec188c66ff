// The stream protocol of the offloaded placements as data (plan, then apply): for one pass, the
// ordered list of operations the executor (offload_device_kv.cpp) issues on the compute, H2D and D2H
// streams, and the event waits and records that order them (specs/headinfer.md §3.4):
//   begin:  the H2D stream waits for every earlier user of both staging slots (they may be re-sliced
//           for another group size), then loads unit 0
//   unit u in slot x = u % 2, per layer in schedule order:
//     compute: wait Loaded[x]; append the pass's rows; record Appended[x]
//     d2h:     wait Appended[x]; store the new rows to the host; record Stored[x]
//              (and LayerStored[l] after the layer's last unit)
//     h2d:     (prefetch u+1 into slot 1-x) wait Computed[1-x], Stored[1-x], LayerStored[l(u+1)];
//              load rows [0, pos0); record Loaded[1-x]
//     compute: attend; record Computed[x]
//   static unit (headinfer --static-heads: a layer's first heads kept in the device arena): append
//     and attend on compute, no slot, no copies, no events; the slots alternate over the offloaded
//     units only
// Pure: no CUDA. The host simulation test (tests/cuda/test_stream_plan.cpp) checks any plan of a
// sequence of passes for unordered conflicting accesses and for attention reading stale rows.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/placement.h"

namespace kvtier::kv_cuda {

enum class StreamId : uint8_t { kCompute, kH2D, kD2H };
constexpr int kNumStreams = 3;

enum class EventKind : uint8_t {
  kLoaded,       // per slot: the slot's H2D has landed
  kAppended,     // per slot: the pass's rows are appended to the slot
  kStored,       // per slot: the slot's write-back has finished reading it
  kComputed,     // per slot: compute has finished with the slot
  kLayerStored,  // per layer: the layer's write-backs of its latest pass have landed
};

struct EventRef {
  EventKind kind = EventKind::kLoaded;
  uint32_t index = 0;  // slot (0/1), or layer for kLayerStored
};

enum class OpKind : uint8_t {
  kWait,    // the stream waits for the event's latest record
  kRecord,  // the event records the stream's work so far
  kLoad,    // h2d: host rows [0, pos0) of the unit -> slot
  kAppend,  // compute: the pass's rows of the unit's heads -> slot rows [pos0, pos0 + n)
  kStore,   // d2h: slot rows [pos0, pos0 + n) -> host
  kAttend,  // compute: attention of the unit's query heads over slot rows [0, pos0 + n)
};

constexpr uint32_t kBeginOps = UINT32_MAX;    // StreamOp::layer of the ops issued at begin_pass
constexpr uint32_t kStaticSlot = UINT32_MAX;  // StreamOp::slot of a static unit's ops

struct StreamOp {
  OpKind kind = OpKind::kWait;
  StreamId stream = StreamId::kCompute;
  EventRef event;              // kWait, kRecord
  uint32_t unit = 0;           // index in the pass plan's units (data ops)
  uint32_t slot = 0;           // staging slot (data ops), or kStaticSlot
  uint32_t layer = kBeginOps;  // the attend(layer) call that issues the op
};

// The ops of one pass over `plan` (pos0 = positions already stored), in issue order. `out` is
// cleared and refilled (its capacity is reused from pass to pass).
void plan_stream_ops(const policy::PassPlan& plan, int64_t pos0, std::vector<StreamOp>& out);

}  // namespace kvtier::kv_cuda
