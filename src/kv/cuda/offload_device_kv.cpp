#include "kv/cuda/offload_device_kv.h"

#include "backend/cuda/bump_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delay.h"
#include "backend/cuda/kv_ops.h"
#include "core/error.h"

namespace kvtier::kv_cuda {

uint64_t offload_host_bytes(const DeviceKvShape& shape) {
  return make_plane_layout(shape, shape.max_positions).total_bytes;
}

OffloadDeviceKv::OffloadDeviceKv(cuda::Context& ctx, const DeviceKvShape& shape, const DeviceKvOptions& opt,
                                 kv::MemoryLedger& ledger)
    : ctx_(ctx),
      shape_(shape),
      opt_(opt),
      host_layout_(make_plane_layout(shape, shape.max_positions)),
      rng_(opt.debug_seed) {
  const policy::Placement pl = opt.placement.placement;
  KVTIER_ASSERT(pl == policy::Placement::kLayer || pl == policy::Placement::kHeadInfer);
  if (opt.placement.static_heads != 0) {
    fail(ErrorKind::kUnsupported, "--static-heads is not implemented on the CUDA backend yet");
  }
  if (opt.placement.prefetch_depth != 1) {
    fail(ErrorKind::kUnsupported,
         "the CUDA backend stages through two ping-pong buffers (--prefetch-depth 1), "
         "not {}",
         opt.placement.prefetch_depth);
  }
  host_reservation_ = kv::Reservation(ledger, kv::Tier::kHost, kv::Category::kKv, host_layout_.total_bytes);
  host_ = static_cast<uint8_t*>(ctx.pinned().allocate_bytes(host_layout_.total_bytes, "host KV planes"));

  scratch_.bytes = split_scratch_bytes(shape);
  scratch_reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kScratch, scratch_.bytes);
  scratch_.ptr = ctx.arena().allocate_bytes(scratch_.bytes, "split-attention scratch");

  constexpr uint64_t kAlign = 256;  // the arena's alignment: what is left after rounding
  staging_bytes_ = opt.staging_bytes;
  if (staging_bytes_ == 0) {
    const uint64_t left = ctx.arena().budget() - ctx.arena().used();
    staging_bytes_ = left / kAlign * kAlign;
  }
  if (staging_bytes_ == 0) {
    fail(ErrorKind::kBudget,
         "no device memory is left for the KV staging buffers (arena of {}): raise --device-mem",
         cuda::format_bytes(ctx.arena().budget()));
  }
  staging_reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kStaging, staging_bytes_);
  staging_ =
      static_cast<uint8_t*>(ctx.arena().allocate_bytes(staging_bytes_, "KV staging (ping-pong) buffers"));
  rows_ = staging_rows(shape, staging_bytes_);
  ev_layer_d2h_.resize(shape.n_head_kv.size());
}

uint8_t* OffloadDeviceKv::buffer(int slot) const {
  return staging_ +
         static_cast<uint64_t>(slot) * plan_.group * 2 * static_cast<uint64_t>(cap_) * row_bytes(shape_);
}

void OffloadDeviceKv::delay(cudaStream_t s) {
  if (opt_.debug_copy_delay_us == 0) return;
  cuda::spin_delay(static_cast<uint32_t>(rng_() % (uint64_t{opt_.debug_copy_delay_us} + 1)), s);
}

void OffloadDeviceKv::begin_pass(int64_t pos0, int64_t n) {
  KVTIER_ASSERT(pos0 == length_ && n > 0 && n <= shape_.max_pass_tokens, "pass [{}, +{}) at length {}", pos0,
                n, length_);
  if (pos0 + n > capacity()) {
    fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", capacity(),
         pos0 + n);
  }
  // Pure decision (policy/placement.h): the group size and the flattened unit schedule.
  plan_ = policy::plan_pass(opt_.placement, policy_shape(shape_), pos0 + n, rows_);
  cap_ = plan_.unit_capacity;
  KVTIER_ASSERT(cap_ >= pos0 + n && !plan_.units.empty());
  pos0_ = pos0;
  n_ = n;
  next_unit_ = 0;
  stats_.last_group = plan_.group;
  // The buffers may be re-sliced for another group size: the first loads wait for every earlier
  // user of either slot.
  cudaStream_t h2d = ctx_.streams().h2d.get();
  for (int s = 0; s < 2; ++s) {
    ev_comp_[s].wait_on(h2d);
    ev_d2h_[s].wait_on(h2d);
  }
  prefetch(0);
}

void OffloadDeviceKv::prefetch(size_t unit) {
  const policy::Unit& u = plan_.units[unit];
  const int slot = static_cast<int>(unit % 2);
  cudaStream_t h2d = ctx_.streams().h2d.get();
  ev_comp_[slot].wait_on(h2d);          // compute is done with the slot's previous unit
  ev_d2h_[slot].wait_on(h2d);           // and so is its write-back
  ev_layer_d2h_[u.layer].wait_on(h2d);  // host rows written back by the last pass have landed
  if (pos0_ > 0) {
    delay(h2d);
    const uint64_t rb = row_bytes(shape_);
    KVTIER_CUDA_CHECK(cudaMemcpy2DAsync(buffer(slot), static_cast<size_t>(cap_) * rb,
                                        host_ + host_layout_.plane(u.layer, u.head0, 0),
                                        host_layout_.plane_bytes, static_cast<size_t>(pos0_) * rb,
                                        size_t{2} * u.n_heads, cudaMemcpyHostToDevice, h2d));
    stats_.bytes_h2d += static_cast<uint64_t>(pos0_) * rb * 2 * u.n_heads;
  }
  ev_h2d_[slot].record(h2d);  // recorded even for an empty copy
}

void OffloadDeviceKv::write(uint32_t layer, const float* k, const float* v, int64_t token_stride) {
  KVTIER_ASSERT(next_unit_ < plan_.units.size() && plan_.units[next_unit_].layer == layer,
                "write of layer {} out of the schedule", layer);
  k_ = k;
  v_ = v;
  kv_token_stride_ = token_stride;
}

void OffloadDeviceKv::attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
                             float* o) {
  const uint32_t hk = shape_.n_head_kv[layer];
  KVTIER_ASSERT(n_head % hk == 0, "{} query heads over {} KV heads", n_head, hk);
  const int64_t d = shape_.head_dim;
  const uint64_t rb = row_bytes(shape_);
  const int64_t head_stride = 2 * cap_ * d;  // elements between heads in a staging buffer
  cudaStream_t comp = ctx_.streams().compute.get();
  cudaStream_t d2h = ctx_.streams().d2h.get();
  while (next_unit_ < plan_.units.size() && plan_.units[next_unit_].layer == layer) {
    const size_t ui = next_unit_++;
    const policy::Unit& u = plan_.units[ui];
    const int slot = static_cast<int>(ui % 2);
    uint8_t* buf = buffer(slot);
    // 1. The unit's past rows have landed.
    ev_h2d_[slot].wait_on(comp);
    // 2. Append the pass's rows of the unit's heads at rows [pos0, pos0 + n).
    const cuda::KvCacheView kview{buf, head_stride, d, shape_.dtype};
    const cuda::KvCacheView vview{buf + static_cast<uint64_t>(cap_) * rb, head_stride, d, shape_.dtype};
    cuda::kv_append(k_ + int64_t{u.head0} * d, kv_token_stride_, n_, u.n_heads, kview, pos0_, nullptr, comp);
    cuda::kv_append(v_ + int64_t{u.head0} * d, kv_token_stride_, n_, u.n_heads, vview, pos0_, nullptr, comp);
    // 3. Write only the new rows back to the host planes.
    ev_new_[slot].record(comp);
    ev_new_[slot].wait_on(d2h);
    delay(d2h);
    KVTIER_CUDA_CHECK(cudaMemcpy2DAsync(
        host_ + host_layout_.plane(u.layer, u.head0, 0) + static_cast<uint64_t>(pos0_) * rb,
        host_layout_.plane_bytes, buf + static_cast<uint64_t>(pos0_) * rb, static_cast<size_t>(cap_) * rb,
        static_cast<size_t>(n_) * rb, size_t{2} * u.n_heads, cudaMemcpyDeviceToHost, d2h));
    stats_.bytes_d2h += static_cast<uint64_t>(n_) * rb * 2 * u.n_heads;
    ev_d2h_[slot].record(d2h);
    const bool last_of_layer = next_unit_ == plan_.units.size() || plan_.units[next_unit_].layer != layer;
    if (last_of_layer) ev_layer_d2h_[layer].record(d2h);
    // 4. Prefetch the next unit of the flattened schedule into the other slot.
    if (next_unit_ < plan_.units.size()) prefetch(next_unit_);
    // 5. Attention of the unit's query heads over rows [0, pos0 + n).
    UnitQueries uq;
    uq.q = q;
    uq.o = o;
    uq.n_tokens = n_;
    uq.pos0 = pos0_;
    uq.n_q_heads_total = n_head;
    uq.q_per_kv = n_head / hk;
    uq.q_head0 = int64_t{u.head0} * uq.q_per_kv;
    uq.n_kv = u.n_heads;
    UnitRows rows;
    rows.k = buf;
    rows.v = buf + static_cast<uint64_t>(cap_) * rb;
    rows.head_stride = head_stride;
    rows.n_keys = pos0_ + n_;
    attend_unit(shape_, la, uq, rows, scratch_, comp);
    // 6. Compute is done with the slot once this is reached.
    ev_comp_[slot].record(comp);
    ++stats_.units;
  }
}

void OffloadDeviceKv::end_pass() {
  KVTIER_ASSERT(next_unit_ == plan_.units.size(), "pass ended after {} of {} units", next_unit_,
                plan_.units.size());
  length_ = pos0_ + n_;
  pos0_ = -1;
  n_ = 0;
}

void OffloadDeviceKv::truncate(int64_t n_tokens) {
  KVTIER_ASSERT(n_tokens >= 0 && n_tokens <= length_ && pos0_ < 0);
  length_ = n_tokens;
}

}  // namespace kvtier::kv_cuda
