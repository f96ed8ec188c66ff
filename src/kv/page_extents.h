// The bytes a TieredKv load reads from its home pages, as pure functions of rows and sizes: the byte
// extents TieredKv's add_rows, add_xrows and add_qgroups name in their copy jobs, and the sizes of
// KIVI's quantised page. The engine builds its copies from these extents, and the planner
// (runtime/kv_phase_predict) counts a decode step's bytes over the link with the same functions, so
// the two cannot drift apart.
#pragma once

#include <cstdint>

#include "backend/cpu/kv_quant.h"
#include "kv/geometry.h"

namespace kvtier::kv {

// The I/O alignment of a disk home read with direct I/O (HomeStore::alignment; a host home is 1).
inline constexpr uint64_t kDirectIoAlign = 4096;
// Home pages (and the staging planes around them) are whole direct-I/O pages.
inline constexpr uint64_t kPageAlign = kDirectIoAlign;

// Bytes [lo, hi) inside one page.
struct Extent {
  uint64_t lo = 0;
  uint64_t hi = 0;
  uint64_t bytes() const { return hi - lo; }
};

// Rows [r0, r1) of a sequence that fall in token block b of a paged plane of `row_bytes` rows, as a
// byte extent of that block's page rounded out to the home's alignment `a` (the bytes around the rows
// are loaded rows or never read as valid). Empty when the rows miss the block.
Extent block_rows_extent(int64_t r0, int64_t r1, int64_t b, int64_t block_tokens, uint64_t row_bytes,
                         uint64_t a);
// The bytes a load of rows [r0, r1) of one plane reads: block_rows_extent summed over its blocks.
uint64_t rows_load_bytes(int64_t r0, int64_t r1, int64_t block_tokens, uint64_t row_bytes, uint64_t a);

// KIVI's quantised page: one head's block, K's packed rows and parameters, then V's from v_offset,
// 4 KiB-rounded for direct I/O (TieredLayout::qpage_bytes, qpage_v_offset).
struct QpageSize {
  uint64_t v_offset = 0;
  uint64_t bytes = 0;
};
QpageSize kivi_qpage_size(const cpu::KiviFormat& f, const KvGeometry& geo);

// A quantised page read from block row t0 > 0 on: K's rows from t0 and all K parameters, then V's rows
// from t0 and all V parameters, page-rounded to `a` and one extent where the rounding joins them.
struct QpageCut {
  Extent k;
  Extent v;
  bool merged = false;  // one extent k.lo..v.hi
  uint64_t bytes() const { return merged ? v.hi - k.lo : k.bytes() + v.bytes(); }
};
QpageCut qpage_cut(const cpu::KiviFormat& f, const KvGeometry& geo, const QpageSize& q, int64_t t0,
                   uint64_t a);

// The bytes one head's load of quantised rows [p0, p1) reads (TieredKv::add_qgroups): the cut page of
// the block p0 falls in when p0 is not block-aligned, then whole pages of every block up to p1.
uint64_t qgroups_load_bytes(const cpu::KiviFormat& f, const KvGeometry& geo, const QpageSize& q, int64_t p0,
                            int64_t p1, uint64_t a);

}  // namespace kvtier::kv
