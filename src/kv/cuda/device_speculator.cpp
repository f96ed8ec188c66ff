#include "kv/cuda/device_speculator.h"

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/spec.h"
#include "core/error.h"
#include "skew/skew_math.h"

namespace kvtier::kv_cuda {
namespace {

constexpr uint64_t kAlign = 256;  // the arena's alignment, per buffer

uint64_t aligned(uint64_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

std::vector<uint8_t> speculating_layers(const DeviceKvShape& s) {
  std::vector<uint8_t> out(s.n_head_kv.size(), 0);
  for (size_t l = 2; l < out.size(); ++l) out[l] = (l >= s.window.size() || s.window[l] == 0) ? 1 : 0;
  return out;
}

}  // namespace

uint64_t DeviceSpeculator::device_bytes(const DeviceKvShape& s, int64_t k) {
  const auto sp = speculating_layers(s);
  const auto P = static_cast<uint64_t>(s.max_positions);
  const auto ld = static_cast<uint64_t>(cuda::spec_row_stride(k));
  const uint64_t d = s.head_dim, L = s.n_head_kv.size();
  uint64_t pk = 0, b = 0, a = 0, sc = 0, hk_max = 0;
  for (size_t l = 0; l < sp.size(); ++l) {
    hk_max = std::max<uint64_t>(hk_max, s.n_head_kv[l]);
    if (!sp[l]) continue;
    pk += uint64_t{s.n_head_kv[l]} * P * ld * 2;
    b += uint64_t{s.n_head_kv[l]} * d * static_cast<uint64_t>(k) * 4;
    a += uint64_t{s.n_head_kv[l]} * d * d * 4;
    sc += uint64_t{s.n_head_kv[l]} * d * 8;
  }
  const auto H = static_cast<uint64_t>(s.max_q_heads);
  return aligned(pk) + aligned(b) + aligned(a) + aligned(sc) + aligned(H * static_cast<uint64_t>(k) * 4) +
         aligned(hk_max * P * 4) + aligned((H * P + H) * 4) + aligned(2 * hk_max * P * 4) +
         aligned(hk_max * 4) + 2 * aligned(L * 4);
}

uint64_t DeviceSpeculator::pinned_bytes(const DeviceKvShape& s) {
  return aligned(2 * s.n_head_kv.size() * 4) + 4096;
}

DeviceSpeculator::DeviceSpeculator(cuda::Context& ctx, const DeviceKvShape& shape, const skew::SkewSet& skew,
                                   const policy::InfinigenParams& params, kv::MemoryLedger& ledger)
    : ctx_(ctx), shape_(shape), params_(params), d_(shape.head_dim), skew_(skew) {
  policy::validate(params);
  if (shape.dtype != cuda::KvDtype::kF16)
    fail(ErrorKind::kUnsupported, "selection infinigen on the GPU needs f16 KV");
  const size_t L = shape.n_head_kv.size();
  if (skew.layers.size() != L || skew.head_dim != shape.head_dim) {
    fail(ErrorKind::kInvalidArgument,
         "the skew file has {} layers of head size {}, the model {} of head size {}: make it for this model "
         "(kvtier skew)",
         skew.layers.size(), skew.head_dim, L, shape.head_dim);
  }
  for (size_t l = 0; l < L; ++l) {
    if (skew.layers[l].n_head_kv != shape.n_head_kv[l]) {
      fail(ErrorKind::kInvalidArgument, "the skew file's layer {} has {} KV heads, the model's {}", l,
           skew.layers[l].n_head_kv, shape.n_head_kv[l]);
    }
  }
  k_ = skew.partial_columns;
  if (k_ <= 0 || k_ > d_) fail(ErrorKind::kInvalidArgument, "the skew file has {} partial columns", k_);
  ld_ = cuda::spec_row_stride(k_);
  speculates_ = speculating_layers(shape);
  pk_offset_.assign(L, 0);
  b_offset_.assign(L, 0);
  a_offset_.assign(L, 0);
  score_offset_.assign(L, 0);
  max_rows_.assign(L, 0);
  n_rows_.assign(L, 0);
  pending_.assign(L, 0);
  const auto P = static_cast<uint64_t>(shape.max_positions);
  uint64_t pk_halves = 0, b_floats = 0, a_floats = 0, scores = 0, widest = 0;
  for (size_t l = 0; l < L; ++l) {
    widest = std::max<uint64_t>(widest, shape.n_head_kv[l]);
    if (!speculates_[l]) continue;
    pk_offset_[l] = pk_halves;
    b_offset_[l] = b_floats;
    a_offset_[l] = a_floats;
    score_offset_[l] = scores;
    a_floats += uint64_t{shape.n_head_kv[l]} * static_cast<uint64_t>(d_ * d_);
    scores += uint64_t{shape.n_head_kv[l]} * static_cast<uint64_t>(d_);
    pk_halves += uint64_t{shape.n_head_kv[l]} * P * static_cast<uint64_t>(ld_);
    b_floats += uint64_t{shape.n_head_kv[l]} * static_cast<uint64_t>(d_ * k_);
  }
  reservation_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kKv, device_bytes(shape, k_));
  auto& a = ctx.arena();
  const auto H = static_cast<uint64_t>(shape.max_q_heads);
  pk_ = a.allocate<uint16_t>(std::max<uint64_t>(pk_halves, 1), "infinigen partial keys");
  b_ = a.allocate<float>(std::max<uint64_t>(b_floats, 1), "infinigen partial projections");
  a_ = a.allocate<float>(std::max<uint64_t>(a_floats, 1), "infinigen skewing matrices");
  score_ = a.allocate<double>(std::max<uint64_t>(scores, 1), "infinigen column scores");
  qp_ = a.allocate<float>(H * static_cast<uint64_t>(k_), "infinigen partial queries");
  gs_ = a.allocate<float>(widest * P, "infinigen group scores");
  hs_ = a.allocate<float>(H * P + H, "infinigen head scores");
  idx_ = a.allocate<int32_t>(2 * widest * P, "infinigen chosen rows");
  counts_ = a.allocate<int32_t>(widest, "infinigen counts");
  chosen_dev_ = a.allocate<int32_t>(L, "infinigen chosen counts");
  n_sel_dev_ = a.allocate<int32_t>(L, "infinigen n_sel");
  chosen_host_ = ctx.pinned().allocate<int32_t>(2 * L, "infinigen chosen counts (host)");

  // B = A[:, cols] per speculating (layer, KV head): [d][k] f32, uploaded once.
  std::vector<float> host(b_floats);
  for (size_t l = 0; l < L; ++l) {
    if (!speculates_[l]) continue;
    const skew::LayerSkew& ls = skew.layers[l];
    for (uint32_t g = 0; g < shape.n_head_kv[l]; ++g) {
      const std::vector<float> bg = policy::partial_matrix(
          ls.head_a(g, d_), d_, std::span<const int32_t>(ls.head_cols(g, k_), static_cast<size_t>(k_)));
      std::copy(bg.begin(), bg.end(),
                host.begin() + static_cast<std::ptrdiff_t>(b_offset_[l] + uint64_t{g} * d_ * k_));
    }
  }
  if (!host.empty()) KVTIER_CUDA_CHECK(cudaMemcpy(b_, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  b_offline_ = std::move(host);
  std::vector<float> a_host(a_floats);
  for (size_t l = 0; l < L; ++l) {
    if (!speculates_[l]) continue;
    const auto& av = skew.layers[l].a;
    std::copy(av.begin(), av.end(), a_host.begin() + static_cast<std::ptrdiff_t>(a_offset_[l]));
  }
  if (!a_host.empty())
    KVTIER_CUDA_CHECK(cudaMemcpy(a_, a_host.data(), a_host.size() * 4, cudaMemcpyHostToDevice));
  KVTIER_CUDA_CHECK(cudaMemset(score_, 0, std::max<uint64_t>(scores, 1) * 8));
  score_host_.resize(scores);
  hk_max_ = static_cast<int64_t>(widest);
  cols_host_.assign(L * widest * static_cast<uint64_t>(k_), 0);
  use_offline_columns();
  for (size_t l = 0; l < L; ++l) {
    start_.emplace_back(cuda::EventTiming::kOn);
    done_.emplace_back(cuda::EventTiming::kOn);
  }
}

void DeviceSpeculator::write_keys(uint32_t layer, const float* k, int64_t token_stride, int64_t n,
                                  int64_t row0, cudaStream_t stream) {
  if (!speculates(layer)) return;
  const int64_t hk = shape_.n_head_kv[layer];
  cuda::spec_partial_rows(k, token_stride, n, hk, d_, b_ + b_offset_[layer], k_, pk_ + pk_offset_[layer],
                          shape_.max_positions * ld_, ld_, row0, stream);
}

void DeviceSpeculator::observe(uint32_t layer, const float* q, int64_t n_head, const float* k,
                               int64_t k_stride, int64_t n, cudaStream_t stream) {
  if (!speculates(layer) || columns_chosen_) return;
  cuda::spec_column_scores(q, n_head, k, k_stride, n, shape_.n_head_kv[layer], d_, a_ + a_offset_[layer],
                           score_ + score_offset_[layer], stream);
}

void DeviceSpeculator::choose_columns(const uint8_t* host_planes, const PlaneLayout& layout, int64_t n_rows,
                                      cudaStream_t stream) {
  KVTIER_ASSERT(!columns_chosen_);
  columns_chosen_ = true;
  // Below the prompt size of kv/partial_keys.h (min_prompt), the offline columns stay: every partial key
  // was written with them.
  constexpr int64_t kMinPrompt = 64;
  if (observed_ < kMinPrompt || score_host_.empty()) return;
  KVTIER_CUDA_CHECK(
      cudaMemcpyAsync(score_host_.data(), score_, score_host_.size() * 8, cudaMemcpyDeviceToHost, stream));
  KVTIER_CUDA_CHECK(cudaStreamSynchronize(stream));
  b_host_.assign(b_offline_.size(), 0.0f);
  for (size_t l = 0; l < speculates_.size(); ++l) {
    if (!speculates_[l]) continue;
    const skew::LayerSkew& ls = skew_.layers[l];
    for (uint32_t g = 0; g < shape_.n_head_kv[l]; ++g) {
      const double* sc = score_host_.data() + score_offset_[l] + uint64_t{g} * d_;
      const std::vector<int32_t> cols = skew::top_columns({sc, static_cast<size_t>(d_)}, k_);
      std::copy(cols.begin(), cols.end(),
                cols_host_.begin() + static_cast<std::ptrdiff_t>((l * hk_max_ + g) * k_));
      const std::vector<float> bg = policy::partial_matrix(ls.head_a(g, d_), d_, cols);
      std::copy(bg.begin(), bg.end(),
                b_host_.begin() + static_cast<std::ptrdiff_t>(b_offset_[l] + uint64_t{g} * d_ * k_));
    }
  }
  KVTIER_CUDA_CHECK(cudaMemcpyAsync(b_, b_host_.data(), b_host_.size() * 4, cudaMemcpyHostToDevice, stream));
  for (size_t l = 0; l < speculates_.size(); ++l) {
    if (!speculates_[l]) continue;
    const auto layer = static_cast<uint32_t>(l);
    const auto* keys = reinterpret_cast<const uint16_t*>(host_planes + layout.plane(layer, 0, 0));
    cuda::spec_partial_rows_f16(keys, 2 * layout.rows * d_, n_rows, shape_.n_head_kv[l], d_,
                                b_ + b_offset_[l], k_, pk_ + pk_offset_[l], shape_.max_positions * ld_, ld_,
                                0, stream);
  }
  KVTIER_CUDA_CHECK(cudaMemsetAsync(score_, 0, score_host_.size() * 8, stream));
  // b_host_ must stay as it is until the upload has read it.
  KVTIER_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DeviceSpeculator::use_offline_columns() {
  for (size_t l = 0; l < speculates_.size(); ++l) {
    for (uint32_t g = 0; g < shape_.n_head_kv[l]; ++g) {
      const int32_t* c = skew_.layers[l].head_cols(g, k_);
      std::copy(c, c + k_, cols_host_.begin() + static_cast<std::ptrdiff_t>((l * hk_max_ + g) * k_));
    }
  }
}

std::vector<int32_t> DeviceSpeculator::columns(uint32_t layer, uint32_t g) const {
  const auto* c = cols_host_.data() + (layer * hk_max_ + g) * k_;
  return {c, c + k_};
}

std::vector<uint16_t> DeviceSpeculator::download_rows(uint32_t layer, uint32_t g, int64_t n) const {
  KVTIER_ASSERT(speculates(layer) && n <= shape_.max_positions);
  std::vector<uint16_t> out(static_cast<size_t>(n * ld_));
  KVTIER_CUDA_CHECK(cudaDeviceSynchronize());
  KVTIER_CUDA_CHECK(cudaMemcpy(out.data(), pk_ + pk_offset_[layer] + uint64_t{g} * shape_.max_positions * ld_,
                               out.size() * 2, cudaMemcpyDeviceToHost));
  return out;
}

void DeviceSpeculator::reset(cudaStream_t stream) {
  use_offline_columns();
  if (columns_chosen_ && !b_offline_.empty()) {
    KVTIER_CUDA_CHECK(
        cudaMemcpyAsync(b_, b_offline_.data(), b_offline_.size() * 4, cudaMemcpyHostToDevice, stream));
  }
  if (!score_host_.empty()) KVTIER_CUDA_CHECK(cudaMemsetAsync(score_, 0, score_host_.size() * 8, stream));
  columns_chosen_ = false;
  observed_ = 0;
}

int32_t* DeviceSpeculator::idx_block(uint32_t layer) const {
  return idx_ + (layer % 2) * hk_max_ * shape_.max_positions;
}

void DeviceSpeculator::speculate(uint32_t layer, const float* q, int64_t n_head, float scale, int64_t n_rows,
                                 cudaStream_t stream) {
  KVTIER_ASSERT(speculates(layer) && n_rows >= 1 && n_rows <= shape_.max_positions &&
                n_head <= shape_.max_q_heads);
  const int64_t hk = shape_.n_head_kv[layer];
  const int64_t cap = policy::speculation_cap(params_.budget, n_rows);
  start_[layer].record(stream);
  cuda::spec_partial_query(q, n_head, n_head / hk, d_, b_ + b_offset_[layer], k_, qp_, stream);
  cuda::SpecScoresArgs sa;
  sa.qp = qp_;
  sa.pk = pk_ + pk_offset_[layer];
  sa.pk_head_stride = shape_.max_positions * ld_;
  sa.ld = ld_;
  sa.k = k_;
  sa.n_head = n_head;
  sa.n_head_kv = hk;
  sa.n_rows = n_rows;
  sa.scale = scale;
  sa.relative = params_.group == policy::InfinigenGroup::kRelative;
  sa.gs = gs_;
  sa.gs_stride = shape_.max_positions;
  sa.head_scratch = hs_;
  cuda::spec_group_scores(sa, stream);
  cuda::SpecChooseArgs ca;
  ca.gs = gs_;
  ca.gs_stride = shape_.max_positions;
  ca.n_head_kv = hk;
  ca.n_rows = n_rows;
  ca.cap = cap;
  ca.alpha = std::isinf(params_.alpha) ? INFINITY : params_.alpha;
  ca.idx = idx_block(layer);
  ca.idx_stride = idx_stride();
  ca.counts = counts_;
  ca.chosen = chosen_dev_ + layer;
  ca.n_sel = n_sel_dev_ + layer;
  cuda::spec_choose_rows(ca, stream);
  KVTIER_CUDA_CHECK(
      cudaMemcpyAsync(chosen_host_ + 2 * layer, chosen_dev_ + layer, 4, cudaMemcpyDeviceToHost, stream));
  KVTIER_CUDA_CHECK(
      cudaMemcpyAsync(chosen_host_ + 2 * layer + 1, n_sel_dev_ + layer, 4, cudaMemcpyDeviceToHost, stream));
  done_[layer].record(stream);
  max_rows_[layer] = std::min(n_rows, cap);
  n_rows_[layer] = n_rows;
  pending_[layer] = 1;
}

int64_t DeviceSpeculator::chosen(uint32_t layer) {
  done_[layer].synchronize();
  const int64_t c = chosen_host_[2 * layer];
  KVTIER_ASSERT(c >= 1 && c <= max_rows_[layer], "speculation of layer {} chose {} rows of at most {}", layer,
                c, max_rows_[layer]);
  const int64_t hk = shape_.n_head_kv[layer];
  ++stats_.layer_steps;
  stats_.rows_total += static_cast<uint64_t>(n_rows_[layer] * hk);
  stats_.rows_fetched += static_cast<uint64_t>(c * hk);
  stats_.n_sel_sum += static_cast<uint64_t>(chosen_host_[2 * layer + 1]);
  return c;
}

void DeviceSpeculator::collect() {
  for (size_t l = 0; l < pending_.size(); ++l) {
    if (!pending_[l]) continue;
    done_[l].synchronize();
    stats_.spec_ms += static_cast<double>(cuda::Event::elapsed_ms(start_[l], done_[l]));
    pending_[l] = 0;
  }
}

}  // namespace kvtier::kv_cuda
