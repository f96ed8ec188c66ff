// Placement `resident` on the GPU: every layer's K and V in the device arena, planes laid out as
// kv_layout.h with max_positions rows, one attention call per layer over all its heads.
#pragma once

#include <cstdint>

#include "backend/cuda/context.h"
#include "kv/cuda/device_kv.h"
#include "kv/cuda/kv_layout.h"
#include "kv/cuda/unit_attention.h"
#include "kv/ledger.h"

namespace kvtier::kv_cuda {

class ResidentDeviceKv final : public DeviceKvCache {
 public:
  // Carves the planes and the split scratch from the context's arena (Error(kBudget) when they do
  // not fit, naming --device-mem) and counts them in the ledger (device tier, kv / scratch).
  ResidentDeviceKv(cuda::Context& ctx, const DeviceKvShape& shape, kv::MemoryLedger& ledger);

  int64_t capacity() const override { return shape_.max_positions; }
  int64_t length() const override { return length_; }
  void begin_pass(int64_t pos0, int64_t n) override;
  void write(uint32_t layer, const float* k, const float* v, int64_t token_stride) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
              float* o) override;
  void end_pass() override;
  void truncate(int64_t n_tokens) override;

 private:
  cuda::Context& ctx_;
  DeviceKvShape shape_;
  // Device planes: [n_layer][n_head_kv][2][max_positions][head_dim] kv dtype.
  PlaneLayout layout_;
  uint8_t* planes_ = nullptr;  // [layout_.total_bytes]
  SplitScratch scratch_;       // [split_scratch_bytes] device
  kv::Reservation kv_reservation_;
  kv::Reservation scratch_reservation_;
  int64_t length_ = 0;
  int64_t pos0_ = -1;  // pass in flight: [pos0_, pos0_ + n_)
  int64_t n_ = 0;
};

}  // namespace kvtier::kv_cuda
