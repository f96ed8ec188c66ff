// What a KV placement allocates, computed without allocating anything. ResidentKv and TieredKv size
// their buffers from these layouts, and planners predict the engine's memory from the same numbers,
// so a prediction equals the ledger's measurement by construction.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "kv/geometry.h"
#include "kv/home_store.h"
#include "kv/unit_scorer.h"
#include "policy/kv_policy.h"
#include "policy/placement.h"
#include "skew/skew_file.h"

namespace kvtier::kv {

class SpeculationObserver;  // kv/speculation_observer.h

// How a KV cache is built: the placement and its settings, the retention, sequences and budgets.
struct KvOptions {
  policy::PlacementConfig placement;
  policy::Retention retention = policy::Retention::kNone;
  policy::Selection selection = policy::Selection::kAll;
  policy::Representation representation = policy::Representation::kF16;  // kivi4 / kivi2: quantised
                                                                         // blocks (f16 rows otherwise)
  policy::PolicyKnobs knobs;    // tuning of the approximate values (budget, sinks, window, ...)
  uint32_t max_seqs = 1;        // sequences sharing the cache's pools
  uint64_t kv_mem = 0;          // compute-local bytes for KV, staging and scratch; 0 = as needed
  std::string disk_dir;         // home tier on disk in this directory; empty = host DRAM
  int64_t max_new_rows = 0;     // largest pass (prefill chunk); sizes the new-row staging
  DiskFaults disk_faults;       // tests
  uint32_t copy_delay_us = 0;   // tests: random delay before each copy job
  double link_bytes_per_s = 0;  // measurement aid (--link-gbps): paces home-tier loads; 0 = not paced
  // kvpr --recompute auto: the profiled home link (bytes/s) and one layer's K/V projection rate
  // (tokens/s) the split-point scheduler weighs; 0 = not profiled (auto then recomputes nothing).
  double kvpr_link_bytes_per_s = 0;
  double kvpr_tokens_per_s = 0;
  // kvpr --recompute auto: the profiled decode weight pass (runtime::Profile::decode_weights_s), the
  // scheduler's estimate of a decode step's other compute before one has been timed; 0 = none.
  double kvpr_decode_weights_s = 0;
  // hybrid --act-ratio auto: one streamed layer's weight load time (Algorithm 1's T_w; 0 when the
  // weights are resident).
  double weight_load_s = 0;
  // selection infinigen: the model's skew file (runtime::load_skew_for); planners may leave it null and
  // then predict the partial keys with floor(0.3 · head_dim) columns.
  std::shared_ptr<const skew::SkewSet> skew;
  // locret: scores each new KV unit (the trained retaining heads); shared with whoever built it.
  std::shared_ptr<UnitScorer> scorer;
  // locret --locret-span word|number: [n_vocab] kv::TokenEdge bits of every token id (token_spans.h).
  std::shared_ptr<const std::vector<uint8_t>> token_edges;
  // selection infinigen: sees every speculation's rows (tests, diagnostics); not owned, may be null.
  SpeculationObserver* speculation_observer = nullptr;
};
using TieredOptions = KvOptions;

// Token blocks one (sequence, layer, group) holds at most: all of the context, or with sliding
// retention on a sliding-window layer, the window plus the largest pass (policy::sliding_blocks).
int64_t layer_blocks(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o);

// The KIVI format of a cache built with these options (bits 0 unless the representation is kivi4 or
// kivi2); throws Error(kInvalidArgument) for knobs that cannot work with the geometry (a key group
// that does not divide the block, ...). Its residual rows are geo.dtype (f16).
cpu::KiviFormat kivi_format_of(const KvGeometry& geo, const KvOptions& o);
// KIVI: f16 blocks one (sequence, layer, group) holds at most (the residual window and the largest
// pass; policy::kivi_f16_blocks), never more than layer_blocks().
int64_t kivi_layer_f16_blocks(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o);

// The resident placement: one block pool per distinct block size, shared by the sequences, with
// layer_blocks() blocks per (sequence, layer, group).
struct ResidentLayout {
  std::vector<uint64_t> pool_block_bytes;  // [n_pools] block size of each pool
  std::vector<uint32_t> pool_blocks;       // [n_pools] blocks of each pool
  std::vector<uint32_t> pool_index;        // [n_layer] pool of each layer
  std::vector<uint32_t> quant_pool_index;  // KIVI: [n_layer] pool of each layer's quantised blocks
  int64_t max_blocks = 0;                  // logical token blocks per (sequence, layer, group)
  uint64_t table_bytes = 0;                // block table(s): (seq, layer, group, block) -> slot, positions
                                           // (KIVI: a second one for the quantised blocks)
  uint64_t kv_bytes = 0;                   // all pools' slabs, the block table and the span list
  uint64_t scratch_bytes = 0;              // attention scratch and retention_bytes
  uint64_t retention_bytes = 0;            // the retention policy's buffers (retention_scratch)
  uint64_t selection_bytes = 0;            // quest: page bounds and selection scratch (in kv_bytes)
};
ResidentLayout resident_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                               const KvOptions& options = {});

// The offloaded placements (layer, headinfer): compute-local static heads (per sequence), new-row
// staging, attention scratch and `n_buffers` staging buffers; the master copy in the home tier, paged:
// each (layer, KV head, K|V) has a region of pages of block_tokens rows, and a block table maps each
// (sequence, layer, token block) to the page index its heads use (pages freed by retention are reused).
struct TieredLayout {
  uint32_t h_max = 0;                   // most KV heads of a layer
  uint32_t n_heads_total = 0;           // KV heads of all layers
  std::vector<uint32_t> head_offset;    // [n_layer] first global head of each layer
  std::vector<uint32_t> static_heads;   // [n_layer] static (resident) heads of each layer
  std::vector<uint64_t> static_offset;  // [n_layer] byte offset of the layer's static heads
  uint64_t static_pitch = 0;            // bytes per static plane (one head's K or V)
  uint64_t static_bytes = 0;            // all sequences' static planes
  uint64_t static_seq_bytes = 0;        // one sequence's static planes
  uint64_t staging_bytes = 0;           // new rows of the largest pass, KV dtype (kvpr: and their
                                        // encoded inputs, and one block's recomputed K/V in f32)
  uint64_t scratch_bytes = 0;           // attention scratch and retention_bytes
  uint64_t retention_bytes = 0;         // the retention policy's buffers (retention_scratch)
  uint32_t n_buffers = 0;               // staging buffers (prefetch depth + 1)
  uint64_t buffer_bytes = 0;            // bytes per staging buffer, page-aligned
  uint64_t page_bytes[2] = {0, 0};      // K, V page: block_tokens rows of one head (page-aligned)
  std::vector<uint32_t> home_pages;     // [n_layer] f16 pages of each (layer, head, K|V) region
  cpu::KiviFormat kivi;                 // bits 0: no quantised pages
  uint64_t qpage_bytes = 0;             // KIVI: one head's quantised K, then V, of a block (4 KiB-rounded)
  uint64_t qpage_v_offset = 0;          // KIVI: where V starts in a quantised page
  std::vector<uint32_t> home_qpages;    // KIVI: [n_layer] quantised pages of each (layer, head)
  uint64_t xrow_bytes = 0;              // kvpr: bytes of one token's stored inputs (the widest layer's)
  uint64_t xpage_bytes = 0;             // kvpr: one block of a layer's inputs (4 KiB-rounded); 0: none
  // kvpr: pages of a layer's inputs: one per f16 page index, with KIVI one per quantised page index
  // (inputs are kept for every position, the f16 pages for the residual window only)
  uint64_t xpages(uint32_t layer) const {
    return home_qpages.empty() ? home_pages[layer] : home_qpages[layer];
  }
  int64_t recompute_rows = 0;  // kvpr: rows recomputed per hook call (one block at most)
  uint64_t head_region_bytes(uint32_t layer) const {  // one head's pages in the layer's home regions
    return home_pages[layer] * (page_bytes[0] + page_bytes[1]) +
           (home_qpages.empty() ? 0 : home_qpages[layer] * qpage_bytes);
  }
  // [n_layer] byte offset of the layer's regions in the home tier: its heads' regions, then (kvpr) its
  // inputs' pages (home_pages[layer] of xpage_bytes)
  std::vector<uint64_t> home_offset;
  uint64_t home_bytes = 0;
  int64_t max_blocks = 0;         // logical token blocks per (sequence, layer)
  uint32_t max_copies = 0;        // extents of one transfer job (one per page per plane at most)
  uint64_t table_bytes = 0;       // the page table and free lists (host)
  uint32_t queue_slots = 0;       // transfer jobs in flight at most
  uint64_t copy_list_bytes = 0;   // the transfer jobs' extent lists (host)
  uint64_t home_block_bytes = 0;  // pin granularity of the home tier: block_tokens rows of a plane
  uint64_t home_pin_bytes = 0;    // the home tier's pin counts (host memory, whatever the home tier)
  // infinigen (tiered_kv_infinigen.cpp): the partial key cache (compute-local KV), and the scratch of the
  // look-ahead and of the attention over the chosen rows (compact planes of a unit).
  int64_t ig_cols = 0;       // partial columns per head (0: not infinigen)
  int64_t ig_rows = 0;       // rows a compact plane holds: the cap over the context, plus the new token
  uint64_t ig_pk_bytes = 0;  // PartialKeys::bytes
  uint64_t ig_scratch_bytes = 0;
  int64_t ig_pool_slots = 0;  // retention pool: slots per (sequence, layer that speculates, KV head); 0: none
  // quest (tiered_kv_quest.cpp): the per-page key bounds (compute-local KV); its selected rows use the
  // infinigen fields above (ig_rows: the budget's rows plus the new token; ig_scratch_bytes: compact
  // planes, chosen rows, selection scratch).
  uint64_t quest_bytes = 0;
};
// The planes of one staging buffer of `buffer_bytes` for units of `group` KV heads: head h's K and V
// rows (f16 planes of `pitch` bytes, `rows` rows of the larger of a K and a V row) at
// (2h + K|V) * pitch, then with KIVI head h's quantised plane at 2 * group * pitch + h * qpitch,
// block b's page at b * qpage_bytes; with kvpr the unit's inputs plane at
// 2 * group * pitch + group * qpitch (qpitch 0 without KIVI), block b's page at b * xpage_bytes.
struct StagingPlanes {
  uint64_t pitch = 0;
  uint64_t qpitch = 0;
  uint64_t xpitch = 0;
  int64_t rows = 0;
};
StagingPlanes staging_planes(const TieredLayout& t, const KvGeometry& geo, uint64_t buffer_bytes,
                             uint32_t group);

// Throws Error(kBudget) naming needed and available bytes when options.kv_mem cannot hold it.
// infinigen: does the layer speculate (>= 2, no window of its own)? Only those layers are pooled.
bool infinigen_speculates(const KvGeometry& geo, uint32_t layer);
// retention pool: slots per (sequence, layer that speculates, KV head) that --kv-pool-limit holds
// (spec infinigen.md §15.14; from one page of block_tokens rows on, rounded down to whole pages, so
// that the home tier's pages of the pool stay within the limit), 0 when unbounded (no limit, or at least
// `capacity` slots). Throws Error(kBudget) naming the minimum when the limit cannot hold one slot of each.
int64_t infinigen_pool_slots(const KvGeometry& geo, int64_t capacity, const KvOptions& o);
// Rows of the partial key cache per (sequence, layer, KV head): the pool's slots, else the capacity.
inline int64_t ig_pk_slots(const TieredLayout& t, int64_t capacity) {
  return t.ig_pool_slots > 0 ? t.ig_pool_slots : capacity;
}
TieredLayout tiered_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                           const TieredOptions& options);

// Bytes of the retention policy's own compute-local buffers (streaming: the queries rotated to the
// sink position, the sink attention's output; StreamingBuffers).
uint64_t retention_scratch(const KvGeometry& geo, int64_t capacity, uint32_t n_head, const KvOptions& o);
// Passes of up to this many tokens (options.max_new_rows, else the capacity).
int64_t max_new_rows(int64_t capacity, const KvOptions& o);
// Positions an offloaded placement's home tier and staging hold per (sequence, layer, KV head): the
// capacity, or with locret the rows it keeps at compact positions (locret_rows).
int64_t tiered_home_rows(int64_t capacity, const KvOptions& o);

// The extra rows (KvNeed bits) a cache built with these options asks the model for.
uint32_t kv_needs(const KvOptions& options);

// Ledger bytes of a placement by tier and category.
struct KvFootprint {
  uint64_t device_kv = 0;
  uint64_t device_staging = 0;
  uint64_t device_scratch = 0;
  uint64_t host_kv = 0;  // the home tier in DRAM, and the home tier's pin counts
  uint64_t disk_kv = 0;
};
// Errors for options that do not apply to the placement (make_kv_cache checks these first).
void check_placement_options(const TieredOptions& options);
// Throws Error(kBudget) when kv_mem (non-zero) cannot hold the resident KV and its scratch.
void check_resident_budget(const ResidentLayout& layout, int64_t capacity, uint64_t kv_mem);

// Validates the options as make_kv_cache does (same errors), then sizes the placement.
KvFootprint kv_footprint(const TieredOptions& options, const KvGeometry& geo, int64_t capacity,
                         uint32_t n_head, int threads);

}  // namespace kvtier::kv
