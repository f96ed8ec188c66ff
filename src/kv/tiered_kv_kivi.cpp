// TieredKv's KIVI representation: quantised pages in the home tier next to the f16 pages of the
// residual window. A unit visit quantises the key groups that leave the residual window with the pass
// from the f16 rows in its staging buffer (the pass itself still attends them in f16), and stores the
// touched quantised pages with its new rows; later passes load quantised pages below the quantised
// end and f16 rows above it. An f16 page is released once every position of its block is quantised.
#include <algorithm>

#include "core/align.h"
#include "core/error.h"
#include "kv/page_extents.h"
#include "kv/tiered_kv.h"
#include "policy/kivi.h"

namespace kvtier::kv {

uint64_t TieredKv::qpage_offset(uint32_t layer, uint32_t head, uint32_t page) const {
  const uint64_t f16 = lay_.home_pages[layer] * (lay_.page_bytes[0] + lay_.page_bytes[1]);
  return lay_.home_offset[layer] + head * lay_.head_region_bytes(layer) + f16 +
         uint64_t{page} * lay_.qpage_bytes;
}

int64_t TieredKv::quantised_end(SeqId seq, int64_t pos0) const {
  return std::max(qend_[seq], policy::kivi_quantised_end(pos0, opt_.knobs.kivi_residual, kivi_.key_group));
}

void TieredKv::ensure_qpages(SeqId seq, uint32_t layer, int64_t p0, int64_t p1) {
  const int64_t bt = geo_.block_tokens;
  for (int64_t b = p0 / bt; p1 > p0 && b <= (p1 - 1) / bt; ++b) {
    BlockEntry& e = qpages_.at(seq, layer, 0, b);
    if (e.slot != BlockTable::kNoSlot) continue;
    KVTIER_ASSERT(!free_qpages_[layer].empty(), "layer {}: no free quantised page for block {}", layer, b);
    e.slot = free_qpages_[layer].back();
    free_qpages_[layer].pop_back();
    e.pos0 = b * bt;
    e.n = static_cast<uint32_t>(bt);
  }
}

void TieredKv::add_qpages(SeqId seq, uint32_t layer, uint32_t head, uint8_t* qplane, int64_t p0, int64_t p1,
                          size_t& n) {
  const int64_t bt = geo_.block_tokens;
  for (int64_t b = p0 / bt; p1 > p0 && b <= (p1 - 1) / bt; ++b) {
    const BlockEntry& e = qpages_.at(seq, layer, 0, b);
    KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} has no quantised page", seq, layer,
                  b);
    add_copy(qpage_offset(layer, head, e.slot), qplane + static_cast<uint64_t>(b) * lay_.qpage_bytes,
             lay_.qpage_bytes, n);
  }
}

void TieredKv::add_qgroups(SeqId seq, uint32_t layer, uint32_t head, uint8_t* qplane, int64_t p0, int64_t p1,
                           size_t& n) {
  const int64_t bt = geo_.block_tokens;
  if (p1 <= p0) return;
  const int64_t t0 = p0 % bt;  // p0's row in its block
  if (t0 == 0) {
    add_qpages(seq, layer, head, qplane, p0, p1, n);
    return;
  }
  // The block p0 cuts: K rows from t0 and K parameters (all groups' scales and mins: small), then the
  // V rows from t0 and V parameters (all tokens'), page-rounded for direct I/O and merged where the
  // rounding joins them; the rows before t0 are recomputed and quantised into the page.
  const int64_t b = p0 / bt;
  const BlockEntry& e = qpages_.at(seq, layer, 0, b);
  KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} has no quantised page", seq, layer,
                b);
  const QpageCut c = qpage_cut(kivi_, geo_, {lay_.qpage_v_offset, lay_.qpage_bytes}, t0, home_->alignment());
  const uint64_t home = qpage_offset(layer, head, e.slot);
  uint8_t* page = qplane + static_cast<uint64_t>(b) * lay_.qpage_bytes;
  if (c.merged) {
    add_copy(home + c.k.lo, page + c.k.lo, c.v.hi - c.k.lo, n);
  } else {
    add_copy(home + c.k.lo, page + c.k.lo, c.k.bytes(), n);
    add_copy(home + c.v.lo, page + c.v.lo, c.v.bytes(), n);
  }
  add_qpages(seq, layer, head, qplane, (b + 1) * bt, p1, n);
}

void TieredKv::quantise_unit(uint8_t* base, const policy::Unit& u, int64_t p0, int64_t p1) {
  const int64_t bt = geo_.block_tokens;
  const int64_t G = kivi_.key_group;
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  p0 = std::max(p0, first_row(u.layer, pass_pos0_));
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    const auto* k = reinterpret_cast<const uint16_t*>(base + 2ull * h * layout_.pitch);  // [rows, dk] f16
    const auto* v = reinterpret_cast<const uint16_t*>(base + (2ull * h + 1) * layout_.pitch);
    for (int64_t p = p0; p < p1; p += G) {
      const int64_t b = p / bt;
      uint8_t* page = qplane(base, h) + static_cast<uint64_t>(b) * lay_.qpage_bytes;  // K, then V
      cpu::kivi_quantize_keys(kivi_, dk, k + p * dk, dk, (p - b * bt) / G, page);
      cpu::kivi_quantize_values(kivi_, dv, v + p * dv, dv, p - b * bt, G, page + lay_.qpage_v_offset);
    }
  }
}

void TieredKv::release_f16_pages(SeqId seq, int64_t qend) {
  const int64_t last = qend / geo_.block_tokens;  // blocks [.., last) hold quantised positions only
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    for (int64_t b = pages_.first_block(seq, l); b < last; ++b) {
      const BlockEntry& e = pages_.at(seq, l, 0, b);
      if (e.slot == BlockTable::kNoSlot) continue;
      // A store of this pass may still write the page (its block's last rows came with the pass).
      for (uint32_t h = 0; h < geo_.n_head_kv[l]; ++h) {
        for (int kv = 0; kv < 2; ++kv) {
          if (engine_->home_pinned(page_offset(l, h, kv, e.slot), lay_.page_bytes[kv])) engine_->drain();
        }
      }
      free_pages_[l].push_back(e.slot);
      pages_.at(seq, l, 0, b) = BlockEntry{};
    }
  }
}

}  // namespace kvtier::kv
