#include "kv/page_extents.h"

#include <algorithm>

#include "core/align.h"

namespace kvtier::kv {

Extent block_rows_extent(int64_t r0, int64_t r1, int64_t b, int64_t block_tokens, uint64_t row_bytes,
                         uint64_t a) {
  const int64_t lo = std::max(r0, b * block_tokens) - b * block_tokens;
  const int64_t hi = std::min(r1, (b + 1) * block_tokens) - b * block_tokens;
  if (hi <= lo) return {};
  return {round_down(static_cast<uint64_t>(lo) * row_bytes, a),
          round_up(static_cast<uint64_t>(hi) * row_bytes, a)};
}

uint64_t rows_load_bytes(int64_t r0, int64_t r1, int64_t block_tokens, uint64_t row_bytes, uint64_t a) {
  uint64_t n = 0;
  for (int64_t b = r0 / block_tokens; r1 > r0 && b <= (r1 - 1) / block_tokens; ++b)
    n += block_rows_extent(r0, r1, b, block_tokens, row_bytes, a).bytes();
  return n;
}

QpageSize kivi_qpage_size(const cpu::KiviFormat& f, const KvGeometry& geo) {
  QpageSize q;
  q.v_offset = cpu::kivi_block_bytes(f, cpu::KiviPlane::kKey, geo.head_dim_k);
  q.bytes =
      round_up(q.v_offset + cpu::kivi_block_bytes(f, cpu::KiviPlane::kValue, geo.head_dim_v), kPageAlign);
  return q;
}

QpageCut qpage_cut(const cpu::KiviFormat& f, const KvGeometry& geo, const QpageSize& q, int64_t t0,
                   uint64_t a) {
  const uint64_t vend = q.v_offset + cpu::kivi_block_bytes(f, cpu::KiviPlane::kValue, geo.head_dim_v);
  const auto t = static_cast<uint64_t>(t0);
  QpageCut c;
  c.k.lo = round_down(t * cpu::kivi_block_parts(f, cpu::KiviPlane::kKey, geo.head_dim_k).row_bytes, a);
  c.k.hi = std::min(round_up(q.v_offset, a), q.bytes);
  c.v.lo = round_down(
      q.v_offset + t * cpu::kivi_block_parts(f, cpu::KiviPlane::kValue, geo.head_dim_v).row_bytes, a);
  c.v.hi = std::min(round_up(vend, a), q.bytes);
  c.merged = c.v.lo <= c.k.hi;
  return c;
}

uint64_t qgroups_load_bytes(const cpu::KiviFormat& f, const KvGeometry& geo, const QpageSize& q, int64_t p0,
                            int64_t p1, uint64_t a) {
  const int64_t bt = geo.block_tokens;
  if (p1 <= p0) return 0;
  uint64_t n = 0;
  if (const int64_t t0 = p0 % bt; t0 != 0) {
    n += qpage_cut(f, geo, q, t0, a).bytes();
    p0 = (p0 / bt + 1) * bt;
  }
  for (int64_t b = p0 / bt; p1 > p0 && b <= (p1 - 1) / bt; ++b) n += q.bytes;
  return n;
}

}  // namespace kvtier::kv
