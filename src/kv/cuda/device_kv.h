// The KV cache of the CUDA forward pass: the model hands it each layer's new K and V (device
// pointers, after RoPE) and asks for attention of its queries; the placement decides where the
// rows live (device arena, or pinned host memory staged through device ping-pong buffers).
// The device twin of kv::KvCache (kv/kv_cache.h), with the same call order:
//   begin_pass(pos0, n); for each layer l: write(l, ...); attend(l, ...); end_pass()
// All work is enqueued on the context's streams; nothing here synchronises the device.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/dtype.h"
#include "backend/cuda/spec.h"
#include "kv/kv_cache.h"
#include "policy/infinigen_select.h"
#include "policy/placement.h"
#include "skew/skew_file.h"

namespace kvtier::kv_cuda {

struct DeviceKvShape {
  std::vector<uint32_t> n_head_kv;  // [n_layer]
  uint32_t head_dim = 0;            // head_dim_k == head_dim_v (checked at construction)
  cuda::KvDtype dtype = cuda::KvDtype::kF16;
  int64_t max_positions = 0;  // positions the cache holds (the context)
  int64_t max_pass_tokens = 0;
  int64_t max_q_heads = 0;      // query heads of the widest layer (split-attention scratch)
  std::vector<int64_t> window;  // [n_layer] sliding window of the layer (0: none; empty: none anywhere)
};

struct DeviceKvOptions {
  policy::PlacementConfig placement;
  // layer / headinfer: device bytes of the two ping-pong staging buffers together (0: what is left
  // in the arena after the split scratch).
  uint64_t staging_bytes = 0;
  // Debug: before every H2D and D2H copy, wait a random 0..delay_us microseconds on the copy's
  // stream (flushes out missing event waits). 0: off.
  uint32_t debug_copy_delay_us = 0;
  uint64_t debug_seed = 1;
  // Selection infinigen (placement layer only): the skew set (outlives the cache) and the knobs.
  policy::Selection selection = policy::Selection::kAll;
  const skew::SkewSet* skew = nullptr;
  policy::InfinigenParams infinigen;
  cuda::GatherKernel gather = cuda::GatherKernel::kPersistent;  // how the chosen rows are read
};

// Transfer statistics of an offloaded placement (zero for resident).
struct DeviceKvStats {
  uint64_t bytes_h2d = 0;
  uint64_t bytes_d2h = 0;
  uint64_t units = 0;       // units attended
  uint32_t last_group = 0;  // g of the last pass
  // Selection infinigen: speculated (pass, layer) pairs, the rows they held and loaded (summed over
  // KV heads), the sum of their n_sel, and the device time of the speculations.
  uint64_t spec_layer_steps = 0;
  uint64_t spec_rows_total = 0;
  uint64_t spec_rows_fetched = 0;
  uint64_t spec_n_sel_sum = 0;
  double spec_ms = 0.0;
};

class DeviceKvCache {
 public:
  virtual ~DeviceKvCache() = default;

  virtual int64_t capacity() const = 0;
  virtual int64_t length() const = 0;

  // Starts a forward pass over positions [pos0, pos0 + n) (pos0 == length()); plans the units.
  virtual void begin_pass(int64_t pos0, int64_t n) = 0;
  // New rows of the pass for `layer` (device, f32):
  //   k: token t, head h at k + t * token_stride + h * head_dim (v alike)
  virtual void write(uint32_t layer, const float* k, const float* v, int64_t token_stride) = 0;
  // Causal attention of the pass's queries over the layer's rows [0, pos0 + n) (device, f32):
  //   q: [n, n_head, head_dim]   o: [n, n_head, head_dim]   (contiguous)
  virtual void attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
                      float* o) = 0;
  // Ends the pass: length() becomes pos0 + n.
  virtual void end_pass() = 0;
  // Forgets positions >= n_tokens (no pass in flight).
  virtual void truncate(int64_t n_tokens) = 0;

  virtual DeviceKvStats stats() const { return {}; }

  // InfiniGen's look-ahead (selection infinigen): whether this pass loads only the speculated rows of
  // `layer`; the forward then computes layer `layer`'s queries from the normed input of layer - 1 and
  // calls look_ahead(layer, ...) before attend(layer - 1) (whose prefetch loads them).
  //   q: [n_head, head_dim] f32, one token, after RoPE; scale: the layer's attention scale
  virtual bool wants_look_ahead(uint32_t /*layer*/) const { return false; }
  virtual void look_ahead(uint32_t /*layer*/, const float* /*q*/, int64_t /*n_head*/, float /*scale*/) {}
};

}  // namespace kvtier::kv_cuda
