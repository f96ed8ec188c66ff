#include "kv/cuda/resident_device_kv.h"

#include "backend/cuda/kv_ops.h"
#include "core/error.h"

namespace kvtier::kv_cuda {

ResidentDeviceKv::ResidentDeviceKv(cuda::Context& ctx, const DeviceKvShape& shape, kv::MemoryLedger& ledger)
    : ctx_(ctx), shape_(shape), layout_(make_plane_layout(shape, shape.max_positions)) {
  kv_reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kKv, layout_.total_bytes);
  planes_ = static_cast<uint8_t*>(ctx.arena().allocate_bytes(layout_.total_bytes, "resident KV cache"));
  scratch_.bytes = split_scratch_bytes(shape);
  scratch_reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kScratch, scratch_.bytes);
  scratch_.ptr = ctx.arena().allocate_bytes(scratch_.bytes, "split-attention scratch");
}

void ResidentDeviceKv::begin_pass(int64_t pos0, int64_t n) {
  KVTIER_ASSERT(pos0 == length_ && n > 0 && n <= shape_.max_pass_tokens, "pass [{}, +{}) at length {}", pos0,
                n, length_);
  if (pos0 + n > capacity()) {
    fail(ErrorKind::kBudget, "context of {} positions is full ({} needed): raise --ctx", capacity(),
         pos0 + n);
  }
  pos0_ = pos0;
  n_ = n;
}

void ResidentDeviceKv::write(uint32_t layer, const float* k, const float* v, int64_t token_stride) {
  const uint32_t hk = shape_.n_head_kv[layer];
  const int64_t d = shape_.head_dim;
  const int64_t head_stride = 2 * layout_.rows * d;  // elements between heads' K planes
  cudaStream_t s = ctx_.streams().compute.get();
  cuda::KvCacheView kview{planes_ + layout_.plane(layer, 0, 0), head_stride, d, shape_.dtype};
  cuda::KvCacheView vview{planes_ + layout_.plane(layer, 0, 1), head_stride, d, shape_.dtype};
  cuda::kv_append(k, token_stride, n_, hk, kview, pos0_, nullptr, s);
  cuda::kv_append(v, token_stride, n_, hk, vview, pos0_, nullptr, s);
}

void ResidentDeviceKv::attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
                              float* o) {
  const uint32_t hk = shape_.n_head_kv[layer];
  KVTIER_ASSERT(n_head % hk == 0, "{} query heads over {} KV heads", n_head, hk);
  UnitQueries uq;
  uq.q = q;
  uq.o = o;
  uq.n_tokens = n_;
  uq.pos0 = pos0_;
  uq.n_q_heads_total = n_head;
  uq.q_head0 = 0;
  uq.n_kv = hk;
  uq.q_per_kv = n_head / hk;
  UnitRows rows;
  rows.k = planes_ + layout_.plane(layer, 0, 0);
  rows.v = planes_ + layout_.plane(layer, 0, 1);
  rows.head_stride = 2 * layout_.rows * shape_.head_dim;
  rows.n_keys = pos0_ + n_;
  attend_unit(shape_, la, uq, rows, scratch_, ctx_.streams().compute.get());
}

void ResidentDeviceKv::end_pass() {
  length_ = pos0_ + n_;
  pos0_ = -1;
  n_ = 0;
}

void ResidentDeviceKv::truncate(int64_t n_tokens) {
  KVTIER_ASSERT(n_tokens >= 0 && n_tokens <= length_ && pos0_ < 0);
  length_ = n_tokens;
}

}  // namespace kvtier::kv_cuda
