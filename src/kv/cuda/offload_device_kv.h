// Placements `layer` and `headinfer` on the GPU (specs/headinfer.md §3.3-3.4): the master copy of
// every (layer, KV head) lives in pinned host memory; a pass walks the flattened (layer, group)
// schedule of policy::plan_pass, staging each unit through two device ping-pong buffers:
//   H2D (h2d stream): rows [0, pos0) of unit u+1 into the other buffer while u computes
//   compute: wait H2D(u); append the pass's new rows; attend over rows [0, pos0 + n)
//   D2H (d2h stream): only the new rows of u back to the host planes
// The operations and the events that order the three streams are the pure plan of stream_plan.h,
// which this class applies; nothing synchronises the device. `layer` is the same executor
// with one unit per layer (g = all heads). The group size of each pass comes from the pure policy
// (fixed --group, or adaptive from the staging capacity and the context thresholds).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/stream.h"
#include "kv/cuda/device_kv.h"
#include "kv/cuda/device_speculator.h"
#include "kv/cuda/kv_layout.h"
#include "kv/cuda/stream_plan.h"
#include "kv/cuda/unit_attention.h"
#include "kv/ledger.h"

namespace kvtier::kv_cuda {

// Pinned host bytes the offloaded placement needs for this shape (the host planes).
uint64_t offload_host_bytes(const DeviceKvShape& shape);

class OffloadDeviceKv final : public DeviceKvCache {
 public:
  // Host planes from the context's pinned pool, staging buffers and split scratch from its arena
  // (opt.staging_bytes, or all that is left); counted in the ledger (host kv, device staging).
  OffloadDeviceKv(cuda::Context& ctx, const DeviceKvShape& shape, const DeviceKvOptions& opt,
                  kv::MemoryLedger& ledger);

  int64_t capacity() const override { return shape_.max_positions; }
  int64_t length() const override { return length_; }
  void begin_pass(int64_t pos0, int64_t n) override;
  void write(uint32_t layer, const float* k, const float* v, int64_t token_stride) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
              float* o) override;
  void end_pass() override;
  void truncate(int64_t n_tokens) override;
  DeviceKvStats stats() const override;
  bool wants_look_ahead(uint32_t layer) const override;
  // Inspection (tests): the speculator (selection infinigen; else null) and the host plane of K of
  // (layer, KV head g): [max_positions][head_dim] f16 bits, current once the device is idle.
  const DeviceSpeculator* speculator() const { return spec_.get(); }
  const uint16_t* host_keys(uint32_t layer, uint32_t g) const {
    return reinterpret_cast<const uint16_t*>(host_ + host_layout_.plane(layer, g, 0));
  }
  void look_ahead(uint32_t layer, const float* q, int64_t n_head, float scale) override;

 private:
  // Per-call arguments of attend() that the attention ops need.
  struct AttendArgs {
    const float* q = nullptr;
    float* o = nullptr;
    int64_t n_head = 0;
    kv::LayerAttention la;
  };
  uint8_t* buffer(uint32_t slot) const;  // slot 0/1 of the ping-pong pair, sliced for the pass's group
  cudaStream_t stream(StreamId s) const;
  cudaEvent_t event(EventRef e) const;
  void run_ops(uint32_t layer, const AttendArgs* a);  // issues the plan's ops of `layer`
  void exec(const StreamOp& op, const AttendArgs* a);
  void delay(cudaStream_t s);  // debug: random wait on a copy stream

  cuda::Context& ctx_;
  DeviceKvShape shape_;
  DeviceKvOptions opt_;
  // Host planes (pinned) of max_positions rows: [n_layer][n_head_kv][2][max_positions][head_dim].
  PlaneLayout host_layout_;
  uint8_t* host_ = nullptr;     // [host_layout_.total_bytes]
  uint8_t* staging_ = nullptr;  // [staging_bytes_] device: two buffers [g][2][cap][head_dim]
  uint64_t staging_bytes_ = 0;
  policy::RowsForGroup rows_;     // staging capacity per group size
  policy::KvShape policy_shape_;  // shape_ as the placement policy sees it
  // Static heads' planes of max_positions rows: [n_layer][n_static][2][max_positions][d] device.
  PlaneLayout static_layout_;
  uint8_t* static_ = nullptr;  // [static_layout_.total_bytes]
  SplitScratch scratch_;       // [split_scratch_bytes] device
  kv::Reservation host_reservation_;
  kv::Reservation static_reservation_;
  kv::Reservation staging_reservation_;
  kv::Reservation scratch_reservation_;

  // Events of stream_plan.h: [kLoaded..kComputed][slot], and one per layer for kLayerStored.
  cuda::Event slot_events_[4][2];
  std::vector<cuda::Event> layer_stored_;  // [n_layer]

  // The pass in flight.
  policy::PassPlan plan_;
  std::vector<StreamOp> ops_;  // stream_plan.h ops of the pass (capacity reused)
  size_t cursor_ = 0;          // next op to issue
  int64_t cap_ = 0;            // rows per staging buffer for plan_.group
  int64_t pos0_ = -1;
  int64_t n_ = 0;
  const float* k_ = nullptr;  // the current layer's new rows (write)
  const float* v_ = nullptr;
  int64_t kv_token_stride_ = 0;
  int64_t length_ = 0;
  DeviceKvStats stats_;
  std::mt19937_64 rng_;

  // Selection infinigen (placement layer): the speculator, the device address of the host planes
  // (the gather reads them over the link), and per layer of the pass in flight whether its rows are the
  // speculated ones and how many (known once attend() has waited for its speculation).
  std::unique_ptr<DeviceSpeculator> spec_;
  const uint8_t* host_device_ = nullptr;
  int sm_count_ = 1;               // the persistent gather's blocks
  std::vector<uint8_t> selected_;  // [n_layer]
  std::vector<int64_t> chosen_;    // [n_layer] rows before the pass's own in the staging slot
  int64_t slot_row0(uint32_t layer) const { return selected_[layer] ? chosen_[layer] : pos0_; }
};

}  // namespace kvtier::kv_cuda
