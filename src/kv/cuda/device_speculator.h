// InfiniGen's speculation on the GPU (specs/infinigen.md §5-7; docs/infinigen.md "On the GPU"), for
// the `layer` placement's executor (offload_device_kv.h):
//   the partial key cache of the layers that speculate (>= 2, no sliding window) in the device arena:
//     [layer][n_head_kv][max_positions][ld] f16, ld = k rounded up to 8 (backend/cuda/spec.h)
//   their projections B = A[:, cols] with the skew file's offline columns: [layer][n_head_kv][d][k] f32
//   one layer's speculation at a time (enqueued on the compute stream by the look-ahead, while the
//   layer before runs): partial queries, scores, the chosen rows per KV head (device, read by the
//   gather on the H2D stream after done(layer)) and their count (pinned host, read by the executor
//   before it appends and attends).
// Columns (§5.1, §15.2, as the CPU's kv/partial_keys.h): the prompt's passes add each layer's column
// scores (sum |q A| + |k A| per column, on the device); at the sequence's first one-token pass the top
// k columns per (layer, KV head) are chosen on the host, B = A[:, cols] is uploaded and the prompt's
// partial keys are rebuilt from the host planes' keys. A prompt of fewer than 64 tokens keeps the skew
// file's offline columns (with which every partial key is written until then).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/stream.h"
#include "kv/cuda/device_kv.h"
#include "kv/cuda/kv_layout.h"
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

  // Whether the sequence's columns are still to be chosen (its prompt is being observed).
  bool observing() const { return !columns_chosen_; }
  // A prompt pass of n tokens (counts towards the 64 that per-sequence columns need).
  void count_prompt(int64_t n) { observed_ += n; }
  // Adds a prompt pass's column scores of `layer`: q [n, n_head, d] f32 and k (token t head g at
  // k + t * k_stride + g * d), both after RoPE.
  void observe(uint32_t layer, const float* q, int64_t n_head, const float* k, int64_t k_stride, int64_t n,
               cudaStream_t stream);
  // Chooses the sequence's columns (or keeps the offline ones for a short prompt) and rebuilds the partial
  // keys of rows [0, n_rows) of every speculating layer from the host planes (device-addressable f16,
  // `layout`; their writes must be ordered before `stream`). Waits for `stream` (once per sequence).
  void choose_columns(const uint8_t* host_planes, const PlaneLayout& layout, int64_t n_rows,
                      cudaStream_t stream);
  // A new sequence: the offline columns again, no scores.
  void reset(cudaStream_t stream);
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
  const int32_t* idx(uint32_t layer) const { return idx_block(layer); }
  const int32_t* chosen_device(uint32_t layer) const { return chosen_dev_ + layer; }
  int64_t idx_stride() const { return shape_.max_positions; }
  int64_t max_rows(uint32_t layer) const { return max_rows_[layer]; }
  int64_t chosen(uint32_t layer);
  // Inspection (tests): the columns of (layer, KV head g), and its first n partial-key rows ([n][ld] f16
  // bits, ld = spec_row_stride(k_cols()); waits for the device).
  std::vector<int32_t> columns(uint32_t layer, uint32_t g) const;
  std::vector<uint16_t> download_rows(uint32_t layer, uint32_t g, int64_t n) const;
  // Folds the finished speculations' timings into the figures (call between passes).
  void collect();
  const SpeculatorStats& stats() const { return stats_; }

 private:
  void use_offline_columns();                // cols_host_ = the skew file's columns
  int32_t* idx_block(uint32_t layer) const;  // the chosen rows' block of `layer`'s parity

  cuda::Context& ctx_;
  DeviceKvShape shape_;
  policy::InfinigenParams params_;
  int64_t d_ = 0;
  int64_t k_ = 0;
  int64_t ld_ = 0;
  int64_t hk_max_ = 0;               // KV heads of the widest layer (the row blocks of idx_, gs_, cols_host_)
  std::vector<uint8_t> speculates_;  // [n_layer]
  std::vector<uint64_t> pk_offset_;  // [n_layer] halves into pk_ (speculating layers)
  std::vector<uint64_t> b_offset_;   // [n_layer] floats into b_
  std::vector<int64_t> max_rows_;    // [n_layer] min(T, cap) of the last speculation
  std::vector<int64_t> n_rows_;      // [n_layer] T of the last speculation
  std::vector<uint8_t> pending_;     // [n_layer] a speculation whose timing is not collected yet
  kv::Reservation reservation_;
  const skew::SkewSet& skew_;
  std::vector<uint64_t> a_offset_;      // [n_layer] floats into a_
  std::vector<uint64_t> score_offset_;  // [n_layer] doubles into score_
  std::vector<float> b_offline_;        // the projections of the offline columns (host copy of b_'s start)
  std::vector<double> score_host_;      // scratch: the scores downloaded to choose columns
  std::vector<float> b_host_;           // scratch: the chosen columns' projections
  std::vector<int32_t> cols_host_;      // [n_layer][max_head_kv][k] the columns in use
  bool columns_chosen_ = false;
  int64_t observed_ = 0;            // prompt tokens observed
  float* a_ = nullptr;              // [speculating layers][n_head_kv][d][d] f32: A per (layer, KV head)
  double* score_ = nullptr;         // [speculating layers][n_head_kv][d] f64 column scores of the prompt
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
