#include "backend/cpu/weight_lanes.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/blocks.h"
#include "core/align.h"
#include "core/error.h"

namespace kvtier::cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// The legacy 4- and 5-bit types: which regions their groups have (weight_lanes.h).
struct LegacyLanes {
  bool high_bits = false;  // q5_0, q5_1
  bool mins = false;       // q4_1, q5_1
  int block_bytes = 0;     // the GGML block
};
LegacyLanes legacy_lanes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return {false, false, sizeof(BlockQ4_0)};
    case GgmlType::kQ4_1:
      return {false, true, sizeof(BlockQ4_1)};
    case GgmlType::kQ5_0:
      return {true, false, sizeof(BlockQ5_0)};
    case GgmlType::kQ5_1:
      return {true, true, sizeof(BlockQ5_1)};
    default:
      return {};
  }
}

// A GGML block's fields by offset (the four legacy layouts differ only in which are present).
struct LegacyFields {
  uint16_t d = 0, m = 0;
  uint32_t qh = 0;
  const uint8_t* qs = nullptr;
};
LegacyFields legacy_fields(GgmlType type, const uint8_t* blk) {
  LegacyFields f;
  std::memcpy(&f.d, blk, 2);
  int at = 2;
  if (legacy_lanes(type).mins) {
    std::memcpy(&f.m, blk + at, 2);
    at += 2;
  }
  if (legacy_lanes(type).high_bits) {
    std::memcpy(&f.qh, blk + at, 4);
    at += 4;
  }
  f.qs = blk + at;
  return f;
}

// q4_K / q6_K: each row's super-blocks into the group's slots (weight_lanes.h).
void pack_kquant(const WeightMatrix& w, LanesWeights& out, int64_t g_begin, int64_t g_end) {
  const int64_t nb = w.k / kQKK;
  const int64_t group_bytes = lanes_group_bytes(w.type, w.k);
  const bool q4 = w.type == GgmlType::kQ4_K;
  const int64_t sb_bytes = q4 ? kQ4KLanesBytes : kQ6KLanesBytes;
  const size_t block = q4 ? sizeof(BlockQ4_K) : sizeof(BlockQ6_K);
  for (int64_t g0 = g_begin * kLaneRows; g0 < g_end * kLaneRows; g0 += kLaneRows) {
    uint8_t* group = out.data() + g0 / kLaneRows * group_bytes;
    std::memset(group, 0, static_cast<size_t>(group_bytes));  // padding rows: scales 0
    for (int r = 0; r < kLaneRows && g0 + r < w.n_rows; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* src = w.data + ((g0 + r) * nb + b) * static_cast<int64_t>(block);
        uint8_t* sb = group + b * sb_bytes;
        if (q4) {
          BlockQ4_K x;
          std::memcpy(&x, src, sizeof(x));
          for (int v = 0; v < 32; ++v) std::memcpy(sb + v * 64 + r * 4, x.qs + 4 * v, 4);
          uint8_t sc[8], mn[8];
          unpack_scales_mins_k4(x.scales, sc, mn);
          for (int j = 0; j < 8; ++j) {
            sb[2048 + j * 16 + r] = sc[j];
            sb[2048 + 128 + j * 16 + r] = mn[j];
          }
          std::memcpy(sb + 2304 + 2 * r, &x.d, 2);
          std::memcpy(sb + 2336 + 2 * r, &x.dmin, 2);
        } else {
          BlockQ6_K x;
          std::memcpy(&x, src, sizeof(x));
          for (int v = 0; v < 32; ++v) std::memcpy(sb + v * 64 + r * 4, x.ql + 4 * v, 4);
          for (int v = 0; v < 16; ++v) std::memcpy(sb + 2048 + v * 64 + r * 4, x.qh + 4 * v, 4);
          for (int j = 0; j < 16; ++j) sb[3072 + j * 16 + r] = static_cast<uint8_t>(x.scales[j]);
          std::memcpy(sb + 3328 + 2 * r, &x.d, 2);
        }
      }
    }
  }
}

// The inverse of pack_kquant for row r (tests): the q4_K scales go back into GGML's 12-byte form.
void unpack_kquant_row(const WeightMatrix& p, int64_t r, uint8_t* out) {
  const int64_t nb = p.k / kQKK;
  const bool q4 = p.type == GgmlType::kQ4_K;
  const int64_t sb_bytes = q4 ? kQ4KLanesBytes : kQ6KLanesBytes;
  const uint8_t* group = p.lanes + r / kLaneRows * lanes_group_bytes(p.type, p.k);
  const int lane = static_cast<int>(r % kLaneRows);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = group + b * sb_bytes;
    if (q4) {
      BlockQ4_K x;
      for (int v = 0; v < 32; ++v) std::memcpy(x.qs + 4 * v, sb + v * 64 + lane * 4, 4);
      uint8_t sc[8], mn[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = sb[2048 + j * 16 + lane];
        mn[j] = sb[2048 + 128 + j * 16 + lane];
      }
      // GGML's packing: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7
      // as nibbles of bytes 8-11 with their top 2 bits in the top bits of bytes 0-7.
      for (int j = 0; j < 4; ++j) {
        x.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        x.scales[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
        x.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
      }
      std::memcpy(&x.d, sb + 2304 + 2 * lane, 2);
      std::memcpy(&x.dmin, sb + 2336 + 2 * lane, 2);
      std::memcpy(out + b * static_cast<int64_t>(sizeof(x)), &x, sizeof(x));
    } else {
      BlockQ6_K x;
      for (int v = 0; v < 32; ++v) std::memcpy(x.ql + 4 * v, sb + v * 64 + lane * 4, 4);
      for (int v = 0; v < 16; ++v) std::memcpy(x.qh + 4 * v, sb + 2048 + v * 64 + lane * 4, 4);
      for (int j = 0; j < 16; ++j) x.scales[j] = static_cast<int8_t>(sb[3072 + j * 16 + lane]);
      std::memcpy(&x.d, sb + 3328 + 2 * lane, 2);
      std::memcpy(out + b * static_cast<int64_t>(sizeof(x)), &x, sizeof(x));
    }
  }
}

void pack_legacy(const WeightMatrix& w, LanesWeights& out, int64_t g_begin, int64_t g_end) {
  const LegacyLanes L = legacy_lanes(w.type);
  const int64_t nb = w.k / kQK;
  const int64_t group_bytes = lanes_group_bytes(w.type, w.k);
  const LegacyRegions at = legacy_regions(w.type, nb);
  for (int64_t g0 = g_begin * kLaneRows; g0 < g_end * kLaneRows; g0 += kLaneRows) {
    uint8_t* group = out.data() + g0 / kLaneRows * group_bytes;
    std::memset(group, 0, static_cast<size_t>(group_bytes));  // padding rows: scale 0, quants 0
    for (int r = 0; r < kLaneRows && g0 + r < w.n_rows; ++r) {
      const uint8_t* row = w.data + (g0 + r) * nb * L.block_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const LegacyFields f = legacy_fields(w.type, row + b * L.block_bytes);
        for (int j = 0; j < 4; ++j)  // bytes 4j..4j+3 of qs: elements 4j+e (low) and 16+4j+e (high)
          std::memcpy(group + at.nibbles + b * 256 + j * 64 + r * 4, f.qs + 4 * j, 4);
        if (L.high_bits) {
          for (int g = 0; g < 8; ++g) {
            uint64_t mask;
            std::memcpy(&mask, group + at.high_bits + b * 64 + g * 8, 8);
            mask |= uint64_t{(f.qh >> (4 * g)) & 0xFu} << (4 * r);
            std::memcpy(group + at.high_bits + b * 64 + g * 8, &mask, 8);
          }
        }
        std::memcpy(group + at.scales + b * 32 + 2 * r, &f.d, 2);
        if (L.mins) std::memcpy(group + at.mins + b * 32 + 2 * r, &f.m, 2);
      }
    }
  }
}

}  // namespace

LegacyRegions legacy_regions(GgmlType type, int64_t nb) {
  const LegacyLanes L = legacy_lanes(type);
  LegacyRegions at;
  at.nibbles = 0;
  at.high_bits = nb * 256;
  at.scales = at.high_bits + (L.high_bits ? nb * 64 : 0);
  at.mins = at.scales + nb * 32;
  at.end = at.mins + (L.mins ? nb * 32 : 0);
  return at;
}

bool has_lanes_layout(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_K || type == GgmlType::kQ6_K ||
         legacy_lanes(type).block_bytes != 0;
}

int64_t lanes_group_bytes(GgmlType type, int64_t k) {
  if (!has_lanes_layout(type))
    fail(ErrorKind::kUnsupported, "no rows-in-lanes layout for {} weights", ggml_type_name(type));
  const int64_t block = ggml_traits(type).block_size;
  if (k <= 0 || k % block != 0)
    fail(ErrorKind::kInvalidArgument, "inner size {} is not a multiple of the {} block size", k,
         ggml_type_name(type));
  if (type == GgmlType::kQ4_K) return k / kQKK * kQ4KLanesBytes;
  if (type == GgmlType::kQ6_K)
    return static_cast<int64_t>(round_up(static_cast<uint64_t>(k / kQKK * kQ6KLanesBytes), 64));
  const int64_t nb = k / kQK;
  if (type != GgmlType::kQ8_0) return static_cast<int64_t>(round_up(legacy_regions(type, nb).end, 64));
  return nb / 2 * kLanesPairBytes + nb % 2 * kLanesOddBytes;
}

int64_t lanes_bytes(GgmlType type, int64_t n_rows, int64_t k) {
  return (n_rows + kLaneRows - 1) / kLaneRows * lanes_group_bytes(type, k);
}

void LanesBuffer::Free::operator()(uint8_t* p) const {
  std::free(p);
}

LanesBuffer::LanesBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = round_up(bytes, kHugePage);
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) throw std::bad_alloc();
  (void)::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without it the pages are small
  data_.reset(static_cast<uint8_t*>(p));
}

LanesWeights::LanesWeights(GgmlType type, int64_t n_rows, int64_t k)
    : LanesWeights(type, n_rows, k,
                   std::make_shared<const LanesBuffer>(static_cast<size_t>(lanes_bytes(type, n_rows, k))),
                   0) {}

LanesWeights::LanesWeights(GgmlType type, int64_t n_rows, int64_t k,
                           std::shared_ptr<const LanesBuffer> buffer, size_t offset)
    : buffer_(std::move(buffer)), type_(type), n_rows_(n_rows), k_(k) {
  size_ = static_cast<size_t>(lanes_bytes(type, n_rows, k));  // checks the type and k
  KVTIER_ASSERT(buffer_ != nullptr && offset % 64 == 0 && offset + size_ <= buffer_->size(),
                "lanes of {} bytes at {} of a buffer of {}", size_, offset,
                buffer_ != nullptr ? buffer_->size() : size_t{0});
  data_ = size_ > 0 ? buffer_->data() + offset : nullptr;
}

WeightMatrix row_slice(const WeightMatrix& w, int64_t r0, int64_t n_rows) {
  KVTIER_ASSERT(r0 >= 0 && n_rows >= 0 && r0 + n_rows <= w.n_rows, "rows {}+{} of {}", r0, n_rows, w.n_rows);
  WeightMatrix s = w;
  s.data = w.data + r0 * static_cast<int64_t>(*ggml_row_bytes(w.type, static_cast<uint64_t>(w.k)));
  s.n_rows = n_rows;
  s.lanes = w.lanes != nullptr && r0 % kLaneRows == 0
                ? w.lanes + r0 / kLaneRows * lanes_group_bytes(w.type, w.k)
                : nullptr;
  return s;
}

LanesWeights pack_lanes(const WeightMatrix& w) {
  LanesWeights out(w.type, w.n_rows, w.k);  // checks the type and k
  pack_lanes_into(w, out);
  return out;
}

void pack_lanes_into(const WeightMatrix& w, LanesWeights& out) {
  pack_lanes_groups(w, out, 0, lanes_groups(w.n_rows));
}

void pack_lanes_groups(const WeightMatrix& w, LanesWeights& out, int64_t g_begin, int64_t g_end) {
  KVTIER_ASSERT(out.type() == w.type && out.n_rows() == w.n_rows && out.k() == w.k,
                "packing a [{}, {}] {} matrix into lanes of a [{}, {}] {}", w.n_rows, w.k,
                ggml_type_name(w.type), out.n_rows(), out.k(), ggml_type_name(out.type()));
  KVTIER_ASSERT(0 <= g_begin && g_begin <= g_end && g_end <= lanes_groups(w.n_rows),
                "row groups [{}, {}) of a matrix of {} rows", g_begin, g_end, w.n_rows);
  if (w.type == GgmlType::kQ4_K || w.type == GgmlType::kQ6_K) {
    pack_kquant(w, out, g_begin, g_end);
    return;
  }
  if (w.type != GgmlType::kQ8_0) {
    pack_legacy(w, out, g_begin, g_end);
    return;
  }
  const int64_t nb = w.k / kQK;
  const int64_t group_bytes = lanes_group_bytes(w.type, w.k);
  const auto* rows = reinterpret_cast<const BlockQ8_0*>(w.data);  // [n_rows, nb]
  for (int64_t g0 = g_begin * kLaneRows; g0 < g_end * kLaneRows; g0 += kLaneRows) {
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
}

void unpack_lanes_row(const LanesWeights& p, int64_t r, uint8_t* out) {
  WeightMatrix w;
  w.type = p.type();
  w.n_rows = p.n_rows();
  w.k = p.k();
  w.lanes = p.data();
  unpack_lanes_row(w, r, out);
}

void unpack_lanes_row(const WeightMatrix& p, int64_t r, uint8_t* out) {
  KVTIER_ASSERT(p.lanes != nullptr && r >= 0 && r < p.n_rows, "row {} of {} (lanes {})", r, p.n_rows,
                static_cast<const void*>(p.lanes));
  const int64_t nb = p.k / kQK;
  const uint8_t* group = p.lanes + r / kLaneRows * lanes_group_bytes(p.type, p.k);
  const int lane = static_cast<int>(r % kLaneRows);
  if (p.type == GgmlType::kQ4_K || p.type == GgmlType::kQ6_K) {
    unpack_kquant_row(p, r, out);
    return;
  }
  if (p.type != GgmlType::kQ8_0) {
    const LegacyLanes L = legacy_lanes(p.type);
    const LegacyRegions at = legacy_regions(p.type, nb);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* blk = out + b * L.block_bytes;
      int field = 0;
      std::memcpy(blk, group + at.scales + b * 32 + 2 * lane, 2);
      field += 2;
      if (L.mins) {
        std::memcpy(blk + field, group + at.mins + b * 32 + 2 * lane, 2);
        field += 2;
      }
      if (L.high_bits) {
        uint32_t qh = 0;
        for (int g = 0; g < 8; ++g) {
          uint64_t mask;
          std::memcpy(&mask, group + at.high_bits + b * 64 + g * 8, 8);
          qh |= static_cast<uint32_t>((mask >> (4 * lane)) & 0xFu) << (4 * g);
        }
        std::memcpy(blk + field, &qh, 4);
        field += 4;
      }
      for (int j = 0; j < 4; ++j)
        std::memcpy(blk + field + 4 * j, group + at.nibbles + b * 256 + j * 64 + lane * 4, 4);
    }
    return;
  }
  auto* x = reinterpret_cast<BlockQ8_0*>(out);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = group + q8_0_quants_at(b);
    for (int e = 0; e < kQK; ++e)
      x[b].qs[e] = static_cast<int8_t>(q[(e / 4) * kLaneRows * 4 + lane * 4 + e % 4] - 128);
    std::memcpy(&x[b].d, group + q8_0_scales_at(b, nb) + 2 * lane, 2);
  }
}

}  // namespace kvtier::cpu
