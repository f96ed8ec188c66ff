// Rows in lanes: a weight matrix re-laid so that one vector register holds the same 4-element group
// of kLaneRows consecutive rows. A one-token product then needs no per-block horizontal reduction:
// each vector instruction advances kLaneRows rows' dots at once, and each row's float chain lives in
// one lane. The layout is a second, owned copy of the same values, made once (pack_lanes); matmul
// uses it where WeightMatrix::lanes is set and the ISA's table has a lanes kernel for the type, with
// every output's bits equal to that table's vec_dot (kernels.h LanesFn).
//
// q8_0 (the one type with a layout so far), per group of kLaneRows rows, nb = k / 32 blocks:
//   blocks in pairs (2p, 2p + 1), 1088 bytes each:
//     [2][8][16][4] u8   quants: [block of the pair][4-element group][row][element] as q + 128
//     [2][16] f16        scales: [block of the pair][row]
//   an odd last block, 576 bytes: [8][16][4] u8 quants, [16] f16 scales, 32 bytes of padding
// Every pair and group starts 64-byte aligned. Rows past n_rows in the last group are zero
// (scale 0, quants 128).
//
// q4_0, q4_1, q5_0, q5_1 (quants u = q + offset, unsigned: 0..15 or 0..31), per group, in regions
// (legacy_regions):
//   nibbles   [nb][4][16][4] u8   vector j: bytes 4j..4j+3 of each row's qs, i.e. elements 4j + e in
//                                 the low nibbles and 16 + 4j + e in the high ones (GGML's order)
//   high_bits [nb][8] u64         q5 only: bit 4r + e of word g = the fifth bit of element 4g + e of row r
//   scales    [nb][16] f16
//   mins      [nb][16] f16        q4_1 / q5_1 only
// the group rounded up to 64 bytes. Padding rows are zero (scale 0).
//
// q4_K, per group, per super-block of 256 (kQ4KLanesBytes, 64-byte multiples):
//   nibbles [4][8][16][4] u8   vector (c, g): bytes 32c + 4g .. + 3 of each row's qs: the low nibbles
//                              are sub-block 2c's group g, the high ones sub-block 2c + 1's
//   scales  [8][16] u8, mins [8][16] u8 (unpacked from the 12 bytes), d [16] f16, dmin [16] f16
// q6_K, per group, per super-block (kQ6KLanesBytes; the group rounded up to 64 bytes):
//   ql [2][16][16][4] u8       vector (h, g): bytes 64h + 4g .. + 3 of each row's ql: low nibbles are
//                              elements 128h + 4g + e, high ones 128h + 64 + 4g + e
//   qh [2][8][16][4] u8        vector (h, g): bytes 32h + 4g .. + 3 of each row's qh: bit pair p holds
//                              elements 128h + 32p + 4g + e
//   scales [16][16] i8, d [16] f16
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/cpu/matmul.h"
#include "core/ggml_type.h"

namespace kvtier::cpu {

constexpr int kLaneRows = 16;
constexpr int64_t kLanesPairBytes = 1088;                       // q8_0: two blocks' quants and scales
constexpr int64_t kLanesOddBytes = 576;                         // q8_0: an odd last block, padded
constexpr int64_t kQ4KLanesBytes = 2048 + 128 + 128 + 32 + 32;  // q4_K: one super-block of 16 rows
constexpr int64_t kQ6KLanesBytes = 2048 + 1024 + 256 + 32;      // q6_K: one super-block of 16 rows

// Byte offsets of q8_0 block b's quants ([8][16][4] u8) and f16 scales ([16]) within a group of nb
// blocks: half b % 2 of pair b / 2, an odd last block's scales right after its quants.
constexpr int64_t q8_0_quants_at(int64_t b) {
  return b / 2 * kLanesPairBytes + b % 2 * 512;
}
constexpr int64_t q8_0_scales_at(int64_t b, int64_t nb) {
  if (b == nb - 1 && nb % 2 == 1) return b / 2 * kLanesPairBytes + 512;
  return b / 2 * kLanesPairBytes + 1024 + b % 2 * 32;
}

// Byte offsets of a legacy type's regions within a group of nb blocks (end: the unrounded size).
struct LegacyRegions {
  int64_t nibbles = 0, high_bits = 0, scales = 0, mins = 0, end = 0;
};
LegacyRegions legacy_regions(GgmlType type, int64_t nb);

// Whether pack_lanes has a layout for the type.
bool has_lanes_layout(GgmlType type);

// Bytes of one group of kLaneRows rows of k elements (k a multiple of the type's block size).
int64_t lanes_group_bytes(GgmlType type, int64_t k);

// Bytes of a packed matrix of n_rows rows (whole groups of kLaneRows; a multiple of 64).
int64_t lanes_bytes(GgmlType type, int64_t n_rows, int64_t k);

// One allocation for packed matrices: 2 MiB aligned and advised as huge pages (the kernels stream a
// whole matrix per token, and with 4 KiB pages they read it 20-25 % slower: docs/benchmarks.md,
// issue 20). Many small matrices share one (a model's layers), so that no matrix takes a 2 MiB page
// of its own.
class LanesBuffer {
 public:
  explicit LanesBuffer(size_t bytes);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

// The 64-byte aligned bytes of a packed matrix: a buffer of its own, or a part of a shared one.
class LanesWeights {
 public:
  LanesWeights(GgmlType type, int64_t n_rows, int64_t k);
  // Bytes [offset, offset + lanes_bytes(type, n_rows, k)) of `buffer` (offset a multiple of 64).
  LanesWeights(GgmlType type, int64_t n_rows, int64_t k, std::shared_ptr<const LanesBuffer> buffer,
               size_t offset);
  const uint8_t* data() const { return data_; }
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  GgmlType type() const { return type_; }
  int64_t n_rows() const { return n_rows_; }
  int64_t k() const { return k_; }

 private:
  std::shared_ptr<const LanesBuffer> buffer_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  GgmlType type_;
  int64_t n_rows_ = 0;
  int64_t k_ = 0;
};

// Rows [r0, r0 + n_rows) of w, as a matrix of their own: its lanes copy too where r0 starts a group
// of kLaneRows rows, else none (the GGUF rows are used).
WeightMatrix row_slice(const WeightMatrix& w, int64_t r0, int64_t n_rows);

// w's values in the lanes layout, in a buffer of their own. Throws Error(kUnsupported) for a type
// without one.
LanesWeights pack_lanes(const WeightMatrix& w);
// The same into `out`, whose type and shape must be w's.
void pack_lanes_into(const WeightMatrix& w, LanesWeights& out);
// Groups of kLaneRows rows in a matrix of n_rows rows (the last one padded).
constexpr int64_t lanes_groups(int64_t n_rows) {
  return (n_rows + kLaneRows - 1) / kLaneRows;
}
// Only row groups [g_begin, g_end) of w into `out` (the rows from g_begin * kLaneRows on): a large
// matrix packed in slices, each slice's GGUF rows read no more once it is packed.
void pack_lanes_groups(const WeightMatrix& w, LanesWeights& out, int64_t g_begin, int64_t g_end);

// Row r of a packed matrix back in its GGML layout ([row bytes of the type]): the inverse of
// pack_lanes. The WeightMatrix form reads w.lanes (which must be set), so a row can be had where
// the GGUF rows' pages were handed back (a tied embedding's lookups).
void unpack_lanes_row(const LanesWeights& p, int64_t r, uint8_t* out);
void unpack_lanes_row(const WeightMatrix& w, int64_t r, uint8_t* out);

}  // namespace kvtier::cpu
