// Sees each of InfiniGen's speculations: the rows a layer attends for one token, per KV head. The
// decode path (kv::TieredKv, selection infinigen) and the teacher-forced emulation
// (kv::InfinigenEmulationKv) report through it, so a test or a diagnostic can hold the two to the same
// choices (spec infinigen.md §14 A6). The observer must not touch the cache it observes.
#pragma once

#include <cstdint>

#include "kv/kv_cache.h"
#include "policy/infinigen_select.h"

namespace kvtier::kv {

class SpeculationObserver {
 public:
  virtual ~SpeculationObserver() = default;
  // Layer `layer`'s speculation for the token of `seq` at `position`: r holds sequence b's rows
  // (r.rows(b, g, n_head_kv) for KV head g, ascending), r.n_sel the shared count, r.chosen[b] the rows
  // each KV head takes (every row before `position` when r.chosen[b] == n_past).
  virtual void on_speculation(SeqId seq, uint32_t layer, int64_t position, int64_t n_past,
                              const policy::SpecResult& r, int64_t b, int64_t n_head_kv) = 0;
};

}  // namespace kvtier::kv
