// Host simulation of the offloaded placements' stream protocol (kv/cuda/stream_plan.h), run without
// a GPU. A sequence of passes (chunked prefill, then decode; group sizes fixed or adaptive, so the
// staging slots get re-sliced) is turned into the ops the executor issues, and two properties are
// checked over every pair of operations:
//   * no race: two ops touching the same bytes (one writing) on different streams are ordered by
//     the events (happens-before from vector clocks: stream order + wait-on-latest-record);
//   * no stale data: executed in issue order, every attention reads, for each row of its heads, the
//     K/V of that (layer, head, position), and each load brings rows that a store has written.
// Together these mean any timing the events allow computes what the sequential order computes. The
// test also shows the checker has teeth: dropping the waits of one event kind makes it fail.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <optional>

#include "kv/cuda/kv_layout.h"
#include "kv/cuda/stream_plan.h"

namespace kvtier::kv_cuda {
namespace {

using Clock = std::array<uint64_t, kNumStreams>;

struct Interval {
  uint64_t begin, end;  // bytes [begin, end) of one address space
};

struct Access {
  std::vector<Interval> reads, writes;
};

// Staging, static planes and host in disjoint address spaces.
constexpr uint64_t kStagingBase = uint64_t{1} << 60;
constexpr uint64_t kStaticBase = uint64_t{2} << 60;

struct DataOp {
  StreamOp op;
  int pass = 0;
  uint64_t index = 0;  // 1-based position on its stream
  Clock clock{};       // happens-before knowledge when it runs
  Access access;
};

struct Pass {
  int64_t pos0, n;
  policy::PassPlan plan;
  std::vector<StreamOp> ops;
};

struct Sim {
  DeviceKvShape shape;
  PlaneLayout host;
  PlaneLayout statics;  // static heads' planes
  uint64_t rb = 0;
  std::vector<DataOp> data_ops;
  std::string error;  // first problem found

  Sim(const DeviceKvShape& s, const policy::PlacementConfig& c)
      : shape(s), host(make_plane_layout(s, s.max_positions)), rb(row_bytes(s)) {
    DeviceKvShape st = s;
    st.n_head_kv = policy::static_heads_per_layer(c, policy_shape(s));
    statics = make_plane_layout(st, s.max_positions);
  }

  // Byte intervals of rows [r0, r1) of the unit's 2g planes, in the slot or on the host.
  std::vector<Interval> slot_rows(const Pass& p, const policy::Unit& u, uint32_t slot, int64_t r0,
                                  int64_t r1) const {
    std::vector<Interval> v;
    if (slot == kStaticSlot) {
      for (uint32_t h = u.head0; h < u.head0 + u.n_heads; ++h) {
        for (uint32_t kv = 0; kv < 2; ++kv) {
          const uint64_t b = kStaticBase + statics.plane(u.layer, h, kv);
          v.push_back({b + static_cast<uint64_t>(r0) * rb, b + static_cast<uint64_t>(r1) * rb});
        }
      }
      return v;
    }
    const uint64_t cap = static_cast<uint64_t>(p.plan.unit_capacity) * rb;
    const uint64_t base = kStagingBase + uint64_t{slot} * p.plan.group * 2 * cap;
    for (uint64_t i = 0; i < 2ull * u.n_heads; ++i) {
      v.push_back(
          {base + i * cap + static_cast<uint64_t>(r0) * rb, base + i * cap + static_cast<uint64_t>(r1) * rb});
    }
    return v;
  }
  std::vector<Interval> host_rows(const policy::Unit& u, int64_t r0, int64_t r1) const {
    std::vector<Interval> v;
    for (uint32_t h = u.head0; h < u.head0 + u.n_heads; ++h) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        const uint64_t b = host.plane(u.layer, h, kv);
        v.push_back({b + static_cast<uint64_t>(r0) * rb, b + static_cast<uint64_t>(r1) * rb});
      }
    }
    return v;
  }

  // Vector clocks over the ops of all passes in issue order.
  void order(const std::vector<Pass>& passes) {
    std::array<Clock, kNumStreams> stream_clock{};
    std::array<uint64_t, kNumStreams> count{};
    std::map<std::pair<int, uint32_t>, Clock> event_clock;
    for (size_t pi = 0; pi < passes.size(); ++pi) {
      const Pass& p = passes[pi];
      for (const StreamOp& op : p.ops) {
        const auto s = static_cast<size_t>(op.stream);
        const std::pair<int, uint32_t> ev{static_cast<int>(op.event.kind), op.event.index};
        if (op.kind == OpKind::kWait) {
          if (auto it = event_clock.find(ev); it != event_clock.end()) {
            for (int j = 0; j < kNumStreams; ++j)
              stream_clock[s][j] = std::max(stream_clock[s][j], it->second[j]);
          }
          continue;
        }
        if (op.kind == OpKind::kRecord) {
          event_clock[ev] = stream_clock[s];
          continue;
        }
        DataOp d;
        d.op = op;
        d.pass = static_cast<int>(pi);
        d.index = ++count[s];
        stream_clock[s][s] = d.index;
        d.clock = stream_clock[s];
        const policy::Unit& u = p.plan.units[op.unit];
        const int64_t end = p.pos0 + p.n;
        switch (op.kind) {
          case OpKind::kLoad:
            d.access.reads = host_rows(u, 0, p.pos0);
            d.access.writes = slot_rows(p, u, op.slot, 0, p.pos0);
            break;
          case OpKind::kAppend:
            d.access.writes = slot_rows(p, u, op.slot, p.pos0, end);
            break;
          case OpKind::kStore:
            d.access.reads = slot_rows(p, u, op.slot, p.pos0, end);
            d.access.writes = host_rows(u, p.pos0, end);
            break;
          case OpKind::kAttend:
            d.access.reads = slot_rows(p, u, op.slot, 0, end);
            break;
          default:
            break;
        }
        data_ops.push_back(std::move(d));
      }
    }
  }

  static bool overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
    for (const Interval& x : a) {
      for (const Interval& y : b) {
        if (x.begin < y.end && y.begin < x.end) return true;
      }
    }
    return false;
  }

  // Every conflicting pair is ordered by happens-before (issue order first to second).
  bool race_free() {
    for (size_t i = 0; i < data_ops.size(); ++i) {
      const DataOp& a = data_ops[i];
      for (size_t j = i + 1; j < data_ops.size(); ++j) {
        const DataOp& b = data_ops[j];
        if (a.op.stream == b.op.stream) continue;  // in-order on one stream
        const bool conflict = overlap(a.access.writes, b.access.writes) ||
                              overlap(a.access.writes, b.access.reads) ||
                              overlap(a.access.reads, b.access.writes);
        if (!conflict) continue;
        if (b.clock[static_cast<size_t>(a.op.stream)] < a.index) {
          error = "race: op " + std::to_string(static_cast<int>(a.op.kind)) + " (pass " +
                  std::to_string(a.pass) + ", unit " + std::to_string(a.op.unit) + ") and op " +
                  std::to_string(static_cast<int>(b.op.kind)) + " (pass " + std::to_string(b.pass) +
                  ", unit " + std::to_string(b.op.unit) + ") are not ordered";
          return false;
        }
      }
    }
    return true;
  }

  // Issue-order execution with row tags: a row holds (layer, head, kv, position) of what it stores.
  bool data_correct(const std::vector<Pass>& passes) {
    using Tag = std::array<int64_t, 4>;
    std::map<uint64_t, Tag> mem;  // row start address -> tag
    for (const DataOp& d : data_ops) {
      const Pass& p = passes[static_cast<size_t>(d.pass)];
      const policy::Unit& u = p.plan.units[d.op.unit];
      const int64_t end = p.pos0 + p.n;
      auto slot_addr = [&](uint32_t i, int64_t r) { return slot_rows(p, u, d.op.slot, r, r + 1)[i].begin; };
      auto host_addr = [&](uint32_t i, int64_t r) { return host_rows(u, r, r + 1)[i].begin; };
      auto want = [&](uint32_t i, int64_t r) { return Tag{u.layer, u.head0 + i / 2, i % 2, r}; };
      for (uint32_t i = 0; i < 2 * u.n_heads; ++i) {
        switch (d.op.kind) {
          case OpKind::kLoad:
            for (int64_t r = 0; r < p.pos0; ++r) {
              auto it = mem.find(host_addr(i, r));
              if (it == mem.end() || it->second != want(i, r)) {
                error = "a load reads a host row no store has written (pass " + std::to_string(d.pass) +
                        ", unit " + std::to_string(d.op.unit) + ", plane " + std::to_string(i) + ", row " +
                        std::to_string(r) +
                        (it == mem.end() ? ", never written)"
                                         : ", holding position " + std::to_string(it->second[3]) + ")");
                return false;
              }
              mem[slot_addr(i, r)] = it->second;
            }
            break;
          case OpKind::kAppend:
            for (int64_t r = p.pos0; r < end; ++r) mem[slot_addr(i, r)] = want(i, r);
            break;
          case OpKind::kStore:
            for (int64_t r = p.pos0; r < end; ++r) mem[host_addr(i, r)] = mem[slot_addr(i, r)];
            break;
          case OpKind::kAttend:
            for (int64_t r = 0; r < end; ++r) {
              auto it = mem.find(slot_addr(i, r));
              if (it == mem.end() || it->second != want(i, r)) {
                error = "attention reads a stale row (pass " + std::to_string(d.pass) + ", unit " +
                        std::to_string(d.op.unit) + ", row " + std::to_string(r) + ")";
                return false;
              }
            }
            break;
          default:
            break;
        }
      }
    }
    return true;
  }
};

DeviceKvShape shape_of(std::vector<uint32_t> heads) {
  DeviceKvShape s;
  s.n_head_kv = std::move(heads);
  s.head_dim = 8;
  s.dtype = cuda::KvDtype::kF16;
  s.max_positions = 1024;
  s.max_pass_tokens = 64;
  s.max_q_heads = 32;
  return s;
}

// Prefill of `prompt` in chunks, then `decode` single-token passes.
std::vector<Pass> make_passes(const DeviceKvShape& s, const policy::PlacementConfig& c,
                              uint64_t staging_bytes, int64_t prompt, int64_t chunk, int decode,
                              std::optional<EventKind> drop_waits = std::nullopt) {
  std::vector<Pass> passes;
  const auto rows = staging_rows(s, staging_bytes);
  auto add = [&](int64_t pos0, int64_t n) {
    Pass p{pos0, n, policy::plan_pass(c, policy_shape(s), pos0 + n, rows), {}};
    plan_stream_ops(p.plan, pos0, p.ops);
    if (drop_waits) {
      std::erase_if(p.ops, [&](const StreamOp& op) {
        return op.kind == OpKind::kWait && op.event.kind == *drop_waits;
      });
    }
    passes.push_back(std::move(p));
  };
  int64_t pos = 0;
  for (; pos < prompt; pos += chunk) add(pos, std::min(chunk, prompt - pos));
  pos = prompt;
  for (int i = 0; i < decode; ++i, ++pos) add(pos, 1);
  return passes;
}

struct Scenario {
  const char* name;
  policy::Placement placement;
  uint32_t group;
  uint64_t staging_bytes;
};

// 8 KV heads of head_dim 8 in f16: 32 bytes a row for K and V of one head; 2 slots.
constexpr uint64_t kShrinking = 2 * 8 * 32 * 64;  // g = 8 holds 64 rows, g = 4 128, g = 2 256, g = 1 512

TEST(CudaStreamPlan, EventsOrderEveryConflictingAccessAndAttentionSeesFreshRows) {
  const DeviceKvShape s = shape_of({8, 8, 8});
  for (const Scenario& sc :
       {Scenario{"layer", policy::Placement::kLayer, 0, uint64_t{1} << 20},
        Scenario{"headinfer g=4", policy::Placement::kHeadInfer, 4, uint64_t{1} << 20},
        Scenario{"headinfer g=1", policy::Placement::kHeadInfer, 1, uint64_t{1} << 20},
        Scenario{"headinfer adaptive (re-sliced slots)", policy::Placement::kHeadInfer, 0, kShrinking}}) {
    policy::PlacementConfig c;
    c.placement = sc.placement;
    c.group = sc.group;
    const auto passes = make_passes(s, c, sc.staging_bytes, 150, 40, 12);
    Sim sim(s, c);
    sim.order(passes);
    EXPECT_TRUE(sim.race_free()) << sc.name << ": " << sim.error;
    EXPECT_TRUE(sim.data_correct(passes)) << sc.name << ": " << sim.error;
  }
}

TEST(CudaStreamPlan, StaticHeadsStayOnTheDeviceAndTheSlotsAlternateOverOffloadedUnits) {
  const DeviceKvShape s = shape_of({8, 8, 8});
  for (uint32_t n_static : {5u, 11u, 24u}) {  // part of a layer; a whole layer and 3 heads; all
    policy::PlacementConfig c;
    c.placement = policy::Placement::kHeadInfer;
    c.group = 2;
    c.static_heads = n_static;
    const auto passes = make_passes(s, c, uint64_t{1} << 20, 150, 40, 6);
    Sim sim(s, c);
    sim.order(passes);
    EXPECT_TRUE(sim.race_free()) << n_static << " static heads: " << sim.error;
    EXPECT_TRUE(sim.data_correct(passes)) << n_static << " static heads: " << sim.error;
    size_t loads = 0;
    for (const auto& d : sim.data_ops) loads += d.op.kind == OpKind::kLoad;
    EXPECT_EQ(loads == 0, n_static == 24) << n_static;
  }
}

TEST(CudaStreamPlan, GroupSizesChangeInTheAdaptiveScenario) {
  const DeviceKvShape s = shape_of({8, 8, 8});
  policy::PlacementConfig c;
  c.placement = policy::Placement::kHeadInfer;
  const auto passes = make_passes(s, c, kShrinking, 150, 40, 12);
  std::vector<uint32_t> groups;
  for (const Pass& p : passes) {
    if (groups.empty() || groups.back() != p.plan.group) groups.push_back(p.plan.group);
  }
  EXPECT_EQ(groups, (std::vector<uint32_t>{8, 4, 2}));
}

TEST(CudaStreamPlan, OddLayersAndSingleUnitLayers) {
  // Layers of 3, 1 and 3 KV heads with g = 1: 7 units a pass, an odd count, so each pass starts a
  // layer's first unit in the other slot than the last pass did.
  const DeviceKvShape s = shape_of({3, 1, 3});
  policy::PlacementConfig c;
  c.placement = policy::Placement::kHeadInfer;
  c.group = 1;
  const auto passes = make_passes(s, c, uint64_t{1} << 20, 70, 33, 9);
  Sim sim(s, c);
  sim.order(passes);
  EXPECT_TRUE(sim.race_free()) << sim.error;
  EXPECT_TRUE(sim.data_correct(passes)) << sim.error;
}

TEST(CudaStreamPlan, DroppingAnEventKindsWaitsIsCaught) {
  const DeviceKvShape s = shape_of({8, 8});
  policy::PlacementConfig c;
  c.placement = policy::Placement::kHeadInfer;
  c.group = 2;
  for (EventKind k : {EventKind::kLoaded, EventKind::kAppended, EventKind::kStored, EventKind::kComputed}) {
    const auto passes = make_passes(s, c, uint64_t{1} << 20, 100, 40, 4, k);
    Sim sim(s, c);
    sim.order(passes);
    EXPECT_FALSE(sim.race_free() && sim.data_correct(passes))
        << "waits on event kind " << static_cast<int>(k);
  }
}

}  // namespace
}  // namespace kvtier::kv_cuda
