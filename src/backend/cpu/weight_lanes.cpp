#include "backend/cpu/weight_lanes.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/blocks.h"
#include "core/align.h"
#include "core/error.h"

namespace kvtier::cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// Offsets of block b's quants and scales within a q8_0 group of nb blocks.
int64_t q8_0_quants_at(int64_t b) {
  return b / 2 * kLanesPairBytes + b % 2 * 512;
}
int64_t q8_0_scales_at(int64_t b, int64_t nb) {
  if (b == nb - 1 && nb % 2 == 1) return b / 2 * kLanesPairBytes + 512;  // the odd last block
  return b / 2 * kLanesPairBytes + 1024 + b % 2 * 32;
}

}  // namespace

bool has_lanes_layout(GgmlType type) {
  return type == GgmlType::kQ8_0;
}

int64_t lanes_group_bytes(GgmlType type, int64_t k) {
  if (!has_lanes_layout(type))
    fail(ErrorKind::kUnsupported, "no rows-in-lanes layout for {} weights", ggml_type_name(type));
  if (k <= 0 || k % kQK != 0)
    fail(ErrorKind::kInvalidArgument, "inner size {} is not a multiple of the {} block size", k,
         ggml_type_name(type));
  const int64_t nb = k / kQK;
  return nb / 2 * kLanesPairBytes + nb % 2 * kLanesOddBytes;
}

void LanesWeights::Free::operator()(uint8_t* p) const {
  std::free(p);
}

LanesWeights::LanesWeights(GgmlType type, int64_t n_rows, int64_t k) : type_(type), n_rows_(n_rows), k_(k) {
  const int64_t groups = (n_rows + kLaneRows - 1) / kLaneRows;
  size_ = static_cast<size_t>(groups * lanes_group_bytes(type, k));
  if (size_ > 0) {
    // 2 MiB aligned and advised as huge pages: the kernels stream the whole matrix per token, and
    // with 4 KiB pages they read it 20-25 % slower (docs/benchmarks.md, issue 20).
    const size_t bytes = round_up(size_, kHugePage);
    void* p = std::aligned_alloc(kHugePage, bytes);
    if (p == nullptr) throw std::bad_alloc();
    (void)::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without it the pages are small
    data_.reset(static_cast<uint8_t*>(p));
  }
}

LanesWeights pack_lanes(const WeightMatrix& w) {
  LanesWeights out(w.type, w.n_rows, w.k);  // checks the type and k
  const int64_t nb = w.k / kQK;
  const int64_t group_bytes = lanes_group_bytes(w.type, w.k);
  const auto* rows = reinterpret_cast<const BlockQ8_0*>(w.data);  // [n_rows, nb]
  for (int64_t g0 = 0; g0 < w.n_rows; g0 += kLaneRows) {
    uint8_t* group = out.data() + g0 / kLaneRows * group_bytes;
    if (nb % 2 == 1) std::memset(group + group_bytes - 32, 0, 32);  // the odd block's padding
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* q = group + q8_0_quants_at(b);      // [8][16][4]
      uint8_t* d = group + q8_0_scales_at(b, nb);  // [16] f16
      for (int r = 0; r < kLaneRows; ++r) {
        const bool real = g0 + r < w.n_rows;
        const BlockQ8_0* x = real ? &rows[(g0 + r) * nb + b] : nullptr;
        for (int g = 0; g < kQK / 4; ++g) {  // 4 quants at a time, each + 128 (a flipped top bit)
          uint32_t v = 0;
          if (real) std::memcpy(&v, x->qs + 4 * g, 4);
          v ^= 0x80808080u;
          std::memcpy(q + g * kLaneRows * 4 + r * 4, &v, 4);
        }
        const uint16_t h = real ? x->d : 0;
        std::memcpy(d + 2 * r, &h, 2);
      }
    }
  }
  return out;
}

void unpack_lanes_row(const LanesWeights& p, int64_t r, uint8_t* out) {
  KVTIER_ASSERT(r >= 0 && r < p.n_rows(), "row {} of {}", r, p.n_rows());
  const int64_t nb = p.k() / kQK;
  const uint8_t* group = p.data() + r / kLaneRows * lanes_group_bytes(p.type(), p.k());
  const int lane = static_cast<int>(r % kLaneRows);
  auto* x = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = group + q8_0_quants_at(b);
    for (int e = 0; e < kQK; ++e)
      x[b].qs[e] = static_cast<int8_t>(q[(e / 4) * kLaneRows * 4 + lane * 4 + e % 4] - 128);
    std::memcpy(&x[b].d, group + q8_0_scales_at(b, nb) + 2 * lane, 2);
  }
}

}  // namespace kvtier::cpu
