// ResidentKv's KIVI representation: at the end of a pass, the key groups that left the residual window
// are quantised from their f16 rows into the block's quantised slot (a pool of its own), and an f16
// block whose every position is quantised goes back to its pool.
#include <algorithm>

#include "kv/resident_kv.h"
#include "policy/kivi.h"

namespace kvtier::kv {

void ResidentKv::flush_kivi(SeqId seq, int64_t end) {
  const int64_t G = kivi_.key_group;
  const int64_t q_new = policy::kivi_quantised_end(end, opt_.knobs.kivi_residual, G);
  const int64_t bt = geo_.block_tokens;
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  const uint64_t kb = cpu::kivi_block_bytes(kivi_, cpu::KiviPlane::kKey, dk);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    const int64_t g = geo_.heads_per_group(l);
    for (uint32_t grp = 0; grp < geo_.n_groups(l); ++grp) {
      for (int64_t p = qend_[seq]; p < q_new; p += G) {  // key group [p, p + G)
        const int64_t b = p / bt;
        BlockEntry& e = table_.at(seq, l, grp, b);
        if (e.slot == BlockTable::kNoSlot) continue;  // freed by sliding retention
        BlockEntry& qe = qtable_.at(seq, l, grp, b);
        if (qe.slot == BlockTable::kNoSlot) {
          qe.slot = quant_pool_of(l).acquire();
          qe.pos0 = b * bt;
        }
        qe.n = static_cast<uint32_t>(p + G - b * bt);
        const auto* rows = reinterpret_cast<const uint16_t*>(pool_of(l).data(e.slot));  // f16
        uint8_t* q = quant_pool_of(l).data(qe.slot);
        const int64_t t0 = p - b * bt;
        for (int64_t i = 0; i < g; ++i) {
          cpu::kivi_quantize_keys(kivi_, dk, rows + (i * bt + t0) * dk, dk, t0 / G, q + i * kb);
          cpu::kivi_quantize_values(
              kivi_, dv, rows + g * bt * dk + (i * bt + t0) * dv, dv, t0, G,
              q + g * kb + i * cpu::kivi_block_bytes(kivi_, cpu::KiviPlane::kValue, dv));
        }
        if (p + G == (b + 1) * bt) {  // the block's last group: its f16 rows are no longer read
          pool_of(l).release(e.slot);
          e = BlockEntry{};
        }
      }
    }
  }
  qend_[seq] = std::max(qend_[seq], q_new);
}

}  // namespace kvtier::kv
