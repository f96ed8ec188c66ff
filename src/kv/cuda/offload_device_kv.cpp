#include "kv/cuda/offload_device_kv.h"

#include <algorithm>

#include "backend/cuda/bump_allocator.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/delay.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/spec.h"
#include "core/error.h"

namespace kvtier::kv_cuda {
namespace {

// cudaMemcpy2D takes pitches up to the device's memPitch (2^31 - 1 bytes on current GPUs): host
// planes of more rows than that are copied one plane at a time instead.
constexpr size_t kMaxPitch = (size_t{1} << 31) - 1;

void copy_planes(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                 cudaMemcpyKind kind, cudaStream_t s) {
  if (width == 0) return;
  if (dpitch <= kMaxPitch && spitch <= kMaxPitch) {
    KVTIER_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, s));
    return;
  }
  for (size_t i = 0; i < height; ++i) {
    KVTIER_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + i * dpitch,
                                      static_cast<const uint8_t*>(src) + i * spitch, width, kind, s));
  }
}

}  // namespace

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
  if (opt.placement.prefetch_depth != 1) {
    fail(ErrorKind::kUnsupported,
         "the CUDA backend stages through two ping-pong buffers (--prefetch-depth 1), "
         "not {}",
         opt.placement.prefetch_depth);
  }
  host_reservation_ = kv::Reservation(ledger, kv::Tier::kHost, kv::Category::kKv, host_layout_.total_bytes);
  host_ = static_cast<uint8_t*>(ctx.pinned().allocate_bytes(host_layout_.total_bytes, "host KV planes"));

  // Static heads (headinfer --static-heads): a prefix of each layer's heads kept in the arena.
  DeviceKvShape static_shape = shape;
  static_shape.n_head_kv = policy::static_heads_per_layer(opt.placement, policy_shape(shape));
  static_layout_ = make_plane_layout(static_shape, shape.max_positions);
  if (static_layout_.total_bytes > 0) {
    static_reservation_ =
        kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kKv, static_layout_.total_bytes);
    static_ =
        static_cast<uint8_t*>(ctx.arena().allocate_bytes(static_layout_.total_bytes, "static KV heads"));
  }

  // Selection infinigen: the partial keys and the speculation's buffers, before the staging takes the rest.
  if (opt.selection == policy::Selection::kInfinigen) {
    if (pl != policy::Placement::kLayer) {
      fail(ErrorKind::kUnsupported,
           "selection infinigen on the CUDA backend runs on the layer placement, not {}",
           policy::placement_name(pl));
    }
    if (opt.skew == nullptr)
      fail(ErrorKind::kInvalidArgument, "selection infinigen needs the model's skew file");
    spec_ = std::make_unique<DeviceSpeculator>(ctx, shape, *opt.skew, opt.infinigen, ledger);
    // The gather kernel reads the host planes directly: pinned memory under unified addressing.
    void* dev = nullptr;
    KVTIER_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host_, 0));
    host_device_ = static_cast<const uint8_t*>(dev);
    int device = 0;
    KVTIER_CUDA_CHECK(cudaGetDevice(&device));
    KVTIER_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  } else if (opt.selection != policy::Selection::kAll) {
    fail(ErrorKind::kUnsupported, "selection {} on the CUDA backend", policy::selection_name(opt.selection));
  }
  selected_.assign(shape.n_head_kv.size(), 0);
  chosen_.assign(shape.n_head_kv.size(), 0);

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
  policy_shape_ = policy_shape(shape);
  layer_stored_.resize(shape.n_head_kv.size());
}

uint8_t* OffloadDeviceKv::buffer(uint32_t slot) const {
  return staging_ + uint64_t{slot} * plan_.group * 2 * static_cast<uint64_t>(cap_) * row_bytes(shape_);
}

cudaStream_t OffloadDeviceKv::stream(StreamId s) const {
  switch (s) {
    case StreamId::kCompute:
      return ctx_.streams().compute.get();
    case StreamId::kH2D:
      return ctx_.streams().h2d.get();
    case StreamId::kD2H:
      return ctx_.streams().d2h.get();
  }
  KVTIER_ASSERT(false, "stream id");
  return nullptr;
}

cudaEvent_t OffloadDeviceKv::event(EventRef e) const {
  if (e.kind == EventKind::kLayerStored) return layer_stored_[e.index].get();
  return slot_events_[static_cast<int>(e.kind)][e.index].get();
}

void OffloadDeviceKv::delay(cudaStream_t s) {
  if (opt_.debug_copy_delay_us == 0) return;
  cuda::spin_delay(static_cast<uint32_t>(rng_() % (uint64_t{opt_.debug_copy_delay_us} + 1)), s);
}

void OffloadDeviceKv::begin_pass(int64_t pos0, int64_t n) {
  KVTIER_ASSERT(pos0 == length_ && n > 0 && n <= shape_.max_pass_tokens, "pass [{}, +{}) at length {}", pos0,
                n, length_);
  KVTIER_ASSERT(cursor_ == ops_.size(), "a pass is still in flight");
  if (pos0 + n > capacity()) {
    fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", capacity(),
         pos0 + n);
  }
  // Pure decisions: the group size and the flattened unit schedule (policy/placement.h), then the
  // stream protocol over it (stream_plan.h); this object only applies them. The schedule depends on
  // the group size only, so a decode step with the last pass's group re-plans nothing and, once
  // ops_ has grown, allocates nothing.
  if (plan_.units.empty() ||
      policy::choose_group(opt_.placement, policy_shape_, pos0 + n, rows_) != plan_.group)
    plan_ = policy::plan_pass(opt_.placement, policy_shape_, pos0 + n, rows_);
  cap_ = plan_.unit_capacity;
  KVTIER_ASSERT(cap_ >= pos0 + n && !plan_.units.empty());
  pos0_ = pos0;
  n_ = n;
  stats_.last_group = plan_.group;
  if (spec_) {
    spec_->collect();
    std::fill(selected_.begin(), selected_.end(), uint8_t{0});
    cudaStream_t compute = ctx_.streams().compute.get();
    if (n == 1 && pos0 >= 1 && spec_->observing()) {
      // The sequence's first one-token pass: its columns, from the prompt's rows in the host planes (every
      // layer's write-backs must have landed).
      for (const cuda::Event& e : layer_stored_) KVTIER_CUDA_CHECK(cudaStreamWaitEvent(compute, e.get(), 0));
      spec_->choose_columns(host_device_, host_layout_, pos0, compute);
    } else if (spec_->observing()) {
      spec_->count_prompt(n);
    }
  }
  plan_stream_ops(plan_, pos0, ops_);
  cursor_ = 0;
  run_ops(kBeginOps, nullptr);
}

void OffloadDeviceKv::write(uint32_t layer, const float* k, const float* v, int64_t token_stride) {
  KVTIER_ASSERT(cursor_ < ops_.size() && ops_[cursor_].layer == layer,
                "write of layer {} out of the schedule", layer);
  k_ = k;
  v_ = v;
  kv_token_stride_ = token_stride;
  if (spec_) spec_->write_keys(layer, k, token_stride, n_, pos0_, ctx_.streams().compute.get());
}

bool OffloadDeviceKv::wants_look_ahead(uint32_t layer) const {
  return spec_ != nullptr && n_ == 1 && pos0_ >= 1 && layer < selected_.size() && spec_->speculates(layer);
}

void OffloadDeviceKv::look_ahead(uint32_t layer, const float* q, int64_t n_head, float scale) {
  KVTIER_ASSERT(wants_look_ahead(layer), "look-ahead of layer {} in a pass that does not speculate it",
                layer);
  // Layer `layer`'s load is issued by attend(layer - 1): this must come first.
  KVTIER_ASSERT(cursor_ < ops_.size() && ops_[cursor_].layer < layer, "look-ahead of layer {} after its load",
                layer);
  spec_->speculate(layer, q, n_head, scale, pos0_, ctx_.streams().compute.get());
  selected_[layer] = 1;
}

DeviceKvStats OffloadDeviceKv::stats() const {
  DeviceKvStats s = stats_;
  if (spec_) {
    const SpeculatorStats& p = spec_->stats();
    s.spec_layer_steps = p.layer_steps;
    s.spec_rows_total = p.rows_total;
    s.spec_rows_fetched = p.rows_fetched;
    s.spec_n_sel_sum = p.n_sel_sum;
    s.spec_ms = p.spec_ms;
  }
  return s;
}

void OffloadDeviceKv::attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
                             float* o) {
  const uint32_t hk = shape_.n_head_kv[layer];
  KVTIER_ASSERT(n_head % hk == 0, "{} query heads over {} KV heads", n_head, hk);
  if (spec_ && spec_->observing())  // a prompt pass: its column scores
    spec_->observe(layer, q, n_head, k_, kv_token_stride_, n_, ctx_.streams().compute.get());
  if (selected_[layer]) {  // the speculated rows' count: appends and attention start after them
    chosen_[layer] = spec_->chosen(layer);
    stats_.bytes_h2d +=
        static_cast<uint64_t>(chosen_[layer]) * row_bytes(shape_) * 2 * shape_.n_head_kv[layer];
  }
  const AttendArgs a{q, o, n_head, la};
  run_ops(layer, &a);
}

void OffloadDeviceKv::run_ops(uint32_t layer, const AttendArgs* a) {
  while (cursor_ < ops_.size() && ops_[cursor_].layer == layer) exec(ops_[cursor_++], a);
}

void OffloadDeviceKv::exec(const StreamOp& op, const AttendArgs* a) {
  cudaStream_t s = stream(op.stream);
  const int64_t d = shape_.head_dim;
  const uint64_t rb = row_bytes(shape_);
  switch (op.kind) {
    case OpKind::kWait:
      KVTIER_CUDA_CHECK(cudaStreamWaitEvent(s, event(op.event), 0));
      return;
    case OpKind::kRecord:
      KVTIER_CUDA_CHECK(cudaEventRecord(event(op.event), s));
      return;
    default:
      break;
  }
  const policy::Unit& u = plan_.units[op.unit];
  // The unit's rows: a staging slot ([g][2][cap][d]), or a static unit's planes in the arena
  // ([n_static][2][max_positions][d]); either way K of head j at buf + 2j pitches, V one pitch on.
  const bool is_static = op.slot == kStaticSlot;
  KVTIER_ASSERT(is_static == u.is_static, "unit {} in slot {}", op.unit, op.slot);
  uint8_t* buf = is_static ? static_ + static_layout_.plane(u.layer, u.head0, 0) : buffer(op.slot);
  const int64_t rows_per_plane = is_static ? static_layout_.rows : cap_;
  const int64_t head_stride = 2 * rows_per_plane * d;  // elements between heads
  const auto cap_bytes = static_cast<size_t>(rows_per_plane) * rb;
  uint8_t* host = host_ + host_layout_.plane(u.layer, u.head0, 0);
  const size_t planes = size_t{2} * u.n_heads;
  switch (op.kind) {
    case OpKind::kLoad:          // host rows [0, pos0) -> slot
      if (selected_[u.layer]) {  // the speculated rows only (counted in attend(), once their number is known)
        KVTIER_CUDA_CHECK(cudaStreamWaitEvent(s, spec_->done(u.layer), 0));
        delay(s);
        cuda::spec_gather_rows(host_device_ + host_layout_.plane(u.layer, u.head0, 0),
                               host_layout_.plane_bytes, buf, cap_bytes, rb, u.n_heads, spec_->idx(u.layer),
                               spec_->idx_stride(), spec_->chosen_device(u.layer), spec_->max_rows(u.layer),
                               s);
        return;
      }
      delay(s);
      copy_planes(buf, cap_bytes, host, host_layout_.plane_bytes, static_cast<size_t>(pos0_) * rb, planes,
                  cudaMemcpyHostToDevice, s);
      stats_.bytes_h2d += static_cast<uint64_t>(pos0_) * rb * planes;
      return;
    case OpKind::kAppend: {  // the pass's rows -> slot rows [r0, r0 + n), r0 = pos0 (or the speculated rows)
      const cuda::KvCacheView kview{buf, head_stride, d, shape_.dtype};
      const cuda::KvCacheView vview{buf + cap_bytes, head_stride, d, shape_.dtype};
      const int64_t r0 = slot_row0(u.layer);
      cuda::kv_append(k_ + int64_t{u.head0} * d, kv_token_stride_, n_, u.n_heads, kview, r0, nullptr, s);
      cuda::kv_append(v_ + int64_t{u.head0} * d, kv_token_stride_, n_, u.n_heads, vview, r0, nullptr, s);
      return;
    }
    case OpKind::kStore: {  // slot rows [r0, r0 + n) -> host rows [pos0, pos0 + n): only the new rows
      delay(s);
      const uint64_t off = static_cast<uint64_t>(pos0_) * rb;
      const uint64_t slot_off = static_cast<uint64_t>(slot_row0(u.layer)) * rb;
      copy_planes(host + off, host_layout_.plane_bytes, buf + slot_off, cap_bytes,
                  static_cast<size_t>(n_) * rb, planes, cudaMemcpyDeviceToHost, s);
      stats_.bytes_d2h += static_cast<uint64_t>(n_) * rb * planes;
      return;
    }
    case OpKind::kAttend: {
      KVTIER_ASSERT(a != nullptr, "attention op outside attend()");
      UnitQueries uq;
      uq.q = a->q;
      uq.o = a->o;
      uq.n_tokens = n_;
      // Speculated rows: the chosen rows then the token's own, all visible to it (no window: such
      // layers do not speculate); rows.n_keys alike.
      uq.pos0 = slot_row0(u.layer);
      uq.n_q_heads_total = a->n_head;
      uq.q_per_kv = a->n_head / shape_.n_head_kv[u.layer];
      uq.q_head0 = int64_t{u.head0} * uq.q_per_kv;
      uq.n_kv = u.n_heads;
      UnitRows rows;
      rows.k = buf;
      rows.v = buf + cap_bytes;
      rows.head_stride = head_stride;
      rows.n_keys = slot_row0(u.layer) + n_;
      attend_unit(shape_, a->la, uq, rows, scratch_, s);
      ++stats_.units;
      return;
    }
    default:
      KVTIER_ASSERT(false, "stream op");
  }
}

void OffloadDeviceKv::end_pass() {
  KVTIER_ASSERT(cursor_ == ops_.size(), "pass ended after {} of {} stream ops", cursor_, ops_.size());
  length_ = pos0_ + n_;
  pos0_ = -1;
  n_ = 0;
}

void OffloadDeviceKv::truncate(int64_t n_tokens) {
  KVTIER_ASSERT(n_tokens >= 0 && n_tokens <= length_ && pos0_ < 0);
  length_ = n_tokens;
  if (spec_ && n_tokens == 0) spec_->reset(ctx_.streams().compute.get());  // a new sequence: new columns
}

}  // namespace kvtier::kv_cuda
