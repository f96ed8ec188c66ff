// InfiniGen's speculation on the GPU (specs/infinigen.md §5-7; docs/infinigen.md "On the GPU"), for
// the `layer` placement's executor (offload_device_kv.h):
//   the partial key cache of the layers that speculate (>= 2, no sliding window) in the device arena:
//     [layer][n_head_kv][max_positions][ld] f16, ld = k rounded up to 8 (backend/cuda/spec.h)
//   their projections B = A[:, cols] with the skew file's offline columns: [layer][n_head_kv][d][k] f32
//   one layer's speculation at a time (enqueued on the compute stream by the look-ahead, while the
//   layer before runs): partial queries, scores, the chosen rows per KV head (device, read by the
//   gather on the H2D stream after done(layer)) and their count (pinned host, read by the executor
//   before it appends and attends).
// The skew file's offline columns are used for every prompt (the CPU chooses each sequence's own
// columns once its prompt has 64 tokens; §15.2): the GPU's selections are not the CPU's.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/stream.h"
#include "kv/cuda/device_kv.h"
#include "kv/ledger.h"
#include "policy/infinigen_select.h"
#include "skew/skew_file.h"

namespace kvtier::kv_cuda {

// Speculation figures of the passes so far.
struct SpeculatorStats {
  uint64_t layer_steps = 0;   // (pass, layer) speculations
  uint64_t rows_total = 0;    // rows the speculated layers held, summed over KV heads
  uint64_t rows_fetched = 0;  // rows they loaded
  uint64_t n_sel_sum = 0;
  double spec_ms = 0.0;  // device time of the speculations (compute stream, events), read one pass late
};

class DeviceSpeculator {
 public:
  // Throws Error(kInvalidArgument) unless the skew set has the shape's layers, head size and KV heads.
  DeviceSpeculator(cuda::Context& ctx, const DeviceKvShape& shape, const skew::SkewSet& skew,
                   const policy::InfinigenParams& params, kv::MemoryLedger& ledger);

  // Device bytes it takes from the arena for this shape (k partial columns) and pinned host bytes.
  static uint64_t device_bytes(const DeviceKvShape& shape, int64_t k);
  static uint64_t pinned_bytes(const DeviceKvShape& shape);

  bool speculates(uint32_t layer) const { return speculates_[layer] != 0; }
  int64_t k_cols() const { return k_; }

  // Partial rows of a pass's new keys of `layer` (after RoPE, token t head g at k + t * token_stride +
  // g * d) at rows [row0, row0 + n).
  void write_keys(uint32_t layer, const float* k, int64_t token_stride, int64_t n, int64_t row0,
                  cudaStream_t stream);
  // Layer `layer`'s speculation over its rows [0, n_rows) from its queries of one token (q: [n_head, d]
  // f32, after RoPE), on `stream`; records done(layer).
  void speculate(uint32_t layer, const float* q, int64_t n_head, float scale, int64_t n_rows,
                 cudaStream_t stream);
  cudaEvent_t done(uint32_t layer) const { return done_[layer].get(); }
  // After speculate(layer): the chosen rows of KV head g at idx(layer) + g * idx_stride() (device),
  // at most max_rows(layer) of them; chosen(layer) waits for done(layer) and gives their count.
  const int32_t* idx(uint32_t layer) const;
  const int32_t* chosen_device(uint32_t layer) const { return chosen_dev_ + layer; }
  int64_t idx_stride() const { return shape_.max_positions; }
  int64_t max_rows(uint32_t layer) const { return max_rows_[layer]; }
  int64_t chosen(uint32_t layer);
  // Folds the finished speculations' timings into the figures (call between passes).
  void collect();
  const SpeculatorStats& stats() const { return stats_; }

 private:
  cuda::Context& ctx_;
  DeviceKvShape shape_;
  policy::InfinigenParams params_;
  int64_t d_ = 0;
  int64_t k_ = 0;
  int64_t ld_ = 0;
  std::vector<uint8_t> speculates_;  // [n_layer]
  std::vector<uint64_t> pk_offset_;  // [n_layer] halves into pk_ (speculating layers)
  std::vector<uint64_t> b_offset_;   // [n_layer] floats into b_
  std::vector<int64_t> max_rows_;    // [n_layer] min(T, cap) of the last speculation
  std::vector<int64_t> n_rows_;      // [n_layer] T of the last speculation
  std::vector<uint8_t> pending_;     // [n_layer] a speculation whose timing is not collected yet
  kv::Reservation reservation_;
  uint16_t* pk_ = nullptr;          // partial keys (above)
  float* b_ = nullptr;              // projections (above)
  float* qp_ = nullptr;             // [n_head, k] f32
  float* gs_ = nullptr;             // [max_head_kv][max_positions] f32 group scores
  float* hs_ = nullptr;             // [max_q_heads * max_positions + max_q_heads] f32 head scores, maxima
  int32_t* idx_ = nullptr;          // [2][max_head_kv][max_positions] i32, by layer parity
  int32_t* counts_ = nullptr;       // [max_head_kv] i32
  int32_t* chosen_dev_ = nullptr;   // [n_layer] i32
  int32_t* n_sel_dev_ = nullptr;    // [n_layer] i32
  int32_t* chosen_host_ = nullptr;  // [2 * n_layer] i32 pinned: chosen, n_sel
  std::vector<cuda::Event> start_;  // [n_layer] timing
  std::vector<cuda::Event> done_;   // [n_layer] timing
  SpeculatorStats stats_;
};

}  // namespace kvtier::kv_cuda
