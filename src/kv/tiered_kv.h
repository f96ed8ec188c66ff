// Offloaded KV placements (`layer`, `headinfer`): the master copy of each offloaded KV head lives in
// a home tier (host DRAM or a disk file); attention of a unit (a group of KV heads of one layer)
// runs on a compute-local staging buffer that the transfer engine filled ahead of time.
//
// Per unit visit (HeadInfer spec 3.4, on the CPU backend):
//   1. wait for the unit's load (rows [0, S_past) of its heads, issued `depth` visits earlier);
//   2. scatter the pass's new rows (already converted to the KV dtype) into the buffer;
//   3. submit the store of the new rows to the home tier (only new rows are written back);
//   4. submit the load of the unit `depth` visits ahead (crossing layer and pass boundaries) into
//      the buffer that the previous visit used;
//   5. attention of the unit's query heads over the buffer.
// Buffers are used round-robin by visit, so a buffer is overwritten only by a load submitted after
// the store that read it; the FIFO transfer engine orders both. Every job pins its home blocks
// (block_tokens rows of one head's K or V) and its staging buffer until it completes: truncate()
// waits for the pins to drop, and the compute never writes into a pinned buffer (asserted).
// With kvpr (tiered_kv_kvpr.cpp) a load carries the stored inputs of a prefix of rows instead of their
// K/V; step 1 then recomputes them (the rows the store of step 3 writes back first, the rest after
// step 4, into bytes no transfer touches, while the next load runs).
// Buffer sizes come from tiered_layout() (kv/footprint.h), which planners use too. Attention sees the same
// bytes at the same positions as the resident placement, tiled identically: outputs are bit-identical.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/footprint.h"
#include "kv/home_store.h"
#include "kv/kv_cache.h"
#include "kv/kv_compute.h"
#include "kv/ledger.h"
#include "kv/partial_keys.h"
#include "kv/pass_state.h"
#include "kv/quest_index.h"
#include "kv/streaming_attend.h"
#include "kv/transfer_engine.h"
#include "kv/unit_scorer.h"
#include "policy/infinigen_select.h"
#include "policy/kv_pool.h"
#include "policy/kvpr_schedule.h"
#include "policy/placement.h"

namespace kvtier::kv {

// infinigen (tiered_kv_infinigen.cpp): what the speculation chose, over the decode steps so far. A
// "layer step" is one (decode pass, layer >= 2 without a window of its own); rows count per (sequence,
// KV head).
struct InfinigenStats {
  uint64_t layer_steps = 0;   // speculations run
  uint64_t rows_total = 0;    // sum of T (the positions before the current token)
  uint64_t rows_fetched = 0;  // sum of the rows chosen (loaded and attended, the current token aside)
  int64_t n_sel_min = 0;      // the shared count n_sel (before the caps) over the layer steps
  int64_t n_sel_max = 0;
  uint64_t n_sel_sum = 0;
  std::vector<uint64_t> layer_rows_total;    // [n_layer] rows_total per layer
  std::vector<uint64_t> layer_rows_fetched;  // [n_layer]
  std::vector<uint64_t> layer_n_sel_sum;     // [n_layer]
  std::vector<uint64_t> layer_steps_of;      // [n_layer]
  double spec_seconds = 0;                   // look-ahead projection, partial scores and selection
  double pk_build_seconds = 0;               // partial keys of the prompts, from the home tier's keys
  uint64_t pk_build_bytes = 0;               // home-tier bytes read for them
  uint64_t selective_loads = 0;              // unit loads that moved the chosen rows only
  // retention pool (the layers that speculate; per (sequence, layer, KV head) pool of pool_slots slots):
  int64_t pool_slots = 0;                      // 0: no pool limit
  int64_t pool_live_max = 0;                   // most rows any pool holds now
  uint64_t pool_live_rows = 0;                 // rows all pools hold now
  uint64_t pool_evictions = 0;                 // new tokens that took a victim's slot (per KV head)
  uint64_t pool_prefill_evictions = 0;         // of them, in prefill passes (a prompt longer than the pool)
  uint64_t pool_young_victims = 0;             // of them, victims not from the older half (none was eligible)
  int64_t pool_max_evicted_pos = -1;           // the newest position evicted
  std::vector<uint64_t> layer_pool_evictions;  // [n_layer]
  std::vector<int64_t> layer_pool_min_live;    // [n_layer] oldest position a pool of the layer holds (-1)
};

// quest (tiered_kv_quest.cpp): the decode steps' page selections, counted per (sequence, KV head) as
// InfinigenStats does.
struct QuestStats {
  uint64_t layer_steps = 0;      // (decode pass, sequence, layer) selections that left pages out
  uint64_t rows_total = 0;       // positions before the current token
  uint64_t rows_fetched = 0;     // of them in the selected pages (loaded and attended)
  uint64_t selective_loads = 0;  // unit loads that moved the selected pages only
};

struct TieredStats {
  TransferStats transfer;
  uint32_t group = 0;  // g of the last pass
  uint64_t passes = 0;
  uint64_t sync_loads = 0;           // loads that were not prefetched (first visit, group change, truncate)
  uint64_t recomputed_rows = 0;      // kvpr: K/V rows (per unit visit, all its heads) recomputed from inputs
  int64_t last_split = 0;            // kvpr: rows recomputed on the last unit visit
  std::vector<int64_t> pass_splits;  // kvpr: of each pass, the rows its last unit visit recomputed
  // The bytes the unit visits used from their loads (rows, not page-rounded I/O; spec kvpr C4):
  uint64_t payload_x_bytes = 0;   // kvpr: stored inputs of the recomputed rows
  uint64_t payload_kv_bytes = 0;  // K/V rows of the past positions (not counted with KIVI or streaming)
  double act_ratio = 0;           // hybrid: R, the ACT:KV block ratio in use (+inf: every block ACT)
  // hybrid, Algorithm 2 (mini-batches of the passes that carry several sequences):
  uint64_t mb_passes = 0;     // batched passes planned
  uint64_t mb_formed = 0;     // mini-batches formed over them
  uint32_t mb_last = 0;       // mini-batches of the last batched pass
  uint32_t mb_last_seqs = 0;  // sequences of that pass
  uint64_t mb_reordered = 0;  // batched passes whose visit order differs from the batch order
  bool mb_balanced = false;   // the last plan weighed profiled rates (else capacity only)
  std::string home;           // where the home tier lives
  InfinigenStats infinigen;   // selection infinigen only
  QuestStats quest;           // selection quest only
};

class TieredKv final : public KvCache {
 public:
  // Throws Error(kBudget) naming needed and available bytes when the placement cannot fit.
  TieredKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
           ThreadPool& pool, cpu::Isa isa, const TieredOptions& options);
  ~TieredKv() override;

  const KvGeometry& geometry() const override { return geo_; }
  int64_t capacity() const override { return capacity_; }
  uint32_t max_sequences() const override { return pages_.n_seqs(); }
  int64_t positions(SeqId seq) const override;
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  uint32_t needs() const override;
  void set_compute(KvCompute* compute) override { compute_ = compute; }
  std::vector<int64_t> plan_prefill(SeqId seq, int64_t n, int64_t chunk) override;
  void end_pass() override;
  void abort_pass() override;
  void truncate(SeqId seq, int64_t n) override;

  TieredStats stats() const;
  // locret (tests): evictions so far, and rows (K/V) each (layer, KV head) of the sequence holds.
  uint64_t locret_evictions() const { return lr_evictions_; }
  // Home blocks and staging buffers pinned by transfers in flight now (tests).
  size_t pinned_blocks() const;

 private:
  struct Visit {  // a load in flight (or done) for an upcoming unit visit
    uint64_t visit = 0;
    policy::Unit unit;
    SeqId seq = 0;
    int64_t first = 0;  // rows [first, rows) loaded
    int64_t rows = 0;
    int64_t qend = 0;       // KIVI: rows [first, qend) loaded quantised, [qend, rows) f16
    int64_t xrows = 0;      // kvpr: rows [first, first + xrows) loaded as inputs, the rest as K/V
    bool xcontext = false;  // kvpr: the inputs' I/O page around row `rows` loaded (add_xcontext)
    uint64_t epoch = 0;
    TransferEngine::Ticket ticket = 0;
    uint64_t sel_pass = 0;  // infinigen: the pass whose chosen rows it loaded (0: every row)
  };
  struct Layout {  // staging layout for one group size
    uint32_t group = 0;
    uint64_t pitch = 0;   // bytes per plane (one head's K or V)
    uint64_t qpitch = 0;  // KIVI: bytes per quantised plane (after the 2 * group f16 planes)
    uint64_t xpitch = 0;  // kvpr: bytes of the unit's inputs plane (after the 2 * group f16 planes)
    int64_t rows = 0;     // rows a plane holds
  };

  void plan(int64_t s_kv);
  // Does streaming retention (sinks + recent window) apply to the layer (not to one with its own window)?
  bool streams(uint32_t layer) const;
  // The stored runs of rows [first, end) of the pass's sequence in `layer` in a plane whose row r is at
  // r * row bytes (blocks dropped by streaming retention left out).
  std::span<const cpu::KvSpan> stored_spans(uint32_t layer, const uint8_t* base, int64_t head_stride,
                                            int64_t first, int64_t end);
  Layout layout_for(uint32_t group) const;
  // First row a pass whose first new token is at `pos0` attends in `layer` (block-aligned; 0 unless
  // sliding retention applies to the layer).
  int64_t first_row(uint32_t layer, int64_t pos0) const;
  // Appends the copies of rows [r0, r1) of one head's K or V between its home pages and the staging
  // plane at `buf` (row r at buf + r * row_bytes): one extent per page (the engine merges adjacent ones).
  void add_rows(SeqId seq, uint32_t layer, uint32_t head, int kv, uint8_t* buf, int64_t r0, int64_t r1,
                size_t& n);
  uint64_t page_offset(uint32_t layer, uint32_t head, int kv, uint32_t page) const;
  // KIVI (tiered_kv_kivi.cpp): the quantised pages, positions of `seq` quantised when a pass that
  // starts at `pos0` runs, quantising a unit's new groups in its staging buffer and moving quantised pages.
  uint64_t qpage_offset(uint32_t layer, uint32_t head, uint32_t page) const;
  int64_t quantised_end(SeqId seq, int64_t pos0) const;
  void ensure_qpages(SeqId seq, uint32_t layer, int64_t p0, int64_t p1);
  void add_qpages(SeqId seq, uint32_t layer, uint32_t head, uint8_t* qplane, int64_t p0, int64_t p1,
                  size_t& n);
  // kivi+kvpr: the load of one head's quantised groups [p0, p1) (p0 a multiple of the key group): the
  // pages of blocks wholly in it, and of the block p0 cuts, the K rows and parameters from p0's group on
  // and the V rows and parameters from p0 on (two extents; the groups before are recomputed).
  void add_qgroups(SeqId seq, uint32_t layer, uint32_t head, uint8_t* qplane, int64_t p0, int64_t p1,
                   size_t& n);
  void quantise_unit(uint8_t* base, const policy::Unit& u, int64_t p0, int64_t p1);
  // kvpr (tiered_kv_kvpr.cpp): inputs of positions [first, first + split) replace their K/V on a visit.
  bool kvpr() const { return lay_.xpage_bytes != 0; }
  // The split never passes x_end(seq, u.layer): rows past it have no stored inputs. kivi+kvpr: nor
  // qend (the f16 residual rows are loaded), and it is whole key groups (rounded down), whose K/V the
  // visit recomputes and quantises as the home copy was (recompute_rows).
  int64_t split_rows(SeqId seq, const policy::Unit& u, int64_t first, int64_t rows, int64_t qend) const;
  // kivi+kvpr: the split's scheduler inputs weigh the quantised bytes of the rows not recomputed.
  int64_t kivi_split(const policy::KvprCosts& c, const policy::Unit& u, int64_t first, int64_t rows,
                     int64_t qend, int64_t visible) const;
  // The page holding (seq, layer, token block b)'s inputs: the f16 page's index, with KIVI the
  // quantised page's (kept for every block).
  uint32_t xpage_of(SeqId seq, uint32_t layer, int64_t b) const;
  // kvpr: positions [0, x_end) of (seq, layer) have their inputs in the home tier. Prefill, hybrid and
  // forced splits N > 0 store every new row's inputs; with auto, random and 0 a decode visit stores its
  // row's inputs only when it recomputes (l > 0), so that a step at l = 0 moves no inputs at all (spec
  // A1: the inputs of the prompt are what the split may use, L_cap = s).
  bool lazy_inputs() const { return kvpr() && !hybrid() && opt_.knobs.recompute <= 0; }
  int64_t& x_end(SeqId seq, uint32_t layer) { return x_end_[seq * geo_.n_layer() + layer]; }
  int64_t x_end(SeqId seq, uint32_t layer) const { return x_end_[seq * geo_.n_layer() + layer]; }
  // Folds one visit's measured recompute (rows of the unit's heads, seconds) into
  // recompute_s_per_row_.
  void calibrate_recompute(const policy::Unit& u, int64_t rows, double seconds);
  // hybrid (HybridServe, tiered_kv_kvpr.cpp): logical block b of every sequence is an activation
  // checkpoint (its inputs loaded, its K/V recomputed) or a KV block, by Eq. 11 with ratio act_ratio_.
  bool hybrid() const { return opt_.representation == policy::Representation::kHybrid; }
  bool act_block(int64_t b) const { return act_blocks_[static_cast<size_t>(b)] != 0; }
  // Algorithm 1's ratio from the profiled rates (0 when not profiled), or the forced one.
  double hybrid_ratio() const;
  // Rows of [r0, r1) in ACT blocks.
  int64_t act_rows(int64_t r0, int64_t r1) const;
  // Algorithm 2's executor order (tiered_kv_kvpr.cpp): batch indices of the open pass, mini-batch by
  // mini-batch (identity unless hybrid with several sequences); each layer visits them in this order.
  void plan_mini_batches();
  // Recomputes the rows of ACT blocks among [first, rows) that lie in [lo, hi).
  void recompute_act(uint8_t* base, const policy::Unit& u, int64_t first, int64_t rows, int64_t lo,
                     int64_t hi);
  uint64_t xpage_offset(uint32_t layer, uint32_t page) const;
  // Appends the copies of the inputs of rows [r0, r1) of `layer` (page-rounded bytes of each block)
  // between the home pages and the inputs plane at `xplane` (block b's page at b * xpage_bytes).
  void add_xrows(SeqId seq, uint32_t layer, uint8_t* xplane, int64_t r0, int64_t r1, size_t& n);
  // The I/O page of the inputs plane that row `pos` starts in, before that row (so that a store of
  // rows from `pos` on writes back loaded bytes around them).
  void add_xcontext(SeqId seq, uint32_t layer, uint8_t* xplane, int64_t pos, size_t& n);
  // The first row whose K or V bytes a store of new rows from pos0 writes back (page-rounded).
  int64_t store_first_row(int64_t pos0) const;
  // K/V of the unit's heads for rows [r0, r1) recomputed from the inputs plane into the K/V planes.
  void recompute_unit(uint8_t* base, const policy::Unit& u, int64_t r0, int64_t r1);
  // recompute_unit, and with KIVI the rows' key groups quantised into the quantised planes as the home
  // copy was (r0, r1 multiples of the key group): the attention reads those.
  void recompute_rows(uint8_t* base, const policy::Unit& u, int64_t r0, int64_t r1);
  // kvpr auto: the steady clock (seconds), and the start of a unit visit (updates hidden_s_).
  static double visit_clock();
  void visit_started(double now);
  // The sequence's new inputs of this pass (rows [pos0, pos0 + n)) into the inputs plane.
  void scatter_new_inputs(uint8_t* xplane, uint32_t layer, int64_t pos0, int64_t n);
  uint8_t* xplane(uint8_t* base) const {  // after the f16 planes and (KIVI) the quantised planes
    return base + 2ull * layout_.group * layout_.pitch + uint64_t{layout_.group} * layout_.qpitch;
  }
  uint8_t* qplane(uint8_t* base, uint32_t h) const {  // head h's quantised pages in a staging buffer
    return base + 2ull * layout_.group * layout_.pitch + h * layout_.qpitch;
  }
  void release_f16_pages(SeqId seq, int64_t qend);
  // Pages for the token blocks of rows [r0, r1) of (seq, layer), taken from the layer's free list.
  void ensure_pages(SeqId seq, uint32_t layer, int64_t r0, int64_t r1);
  void release_pages(SeqId seq, uint32_t layer, int64_t b0, int64_t b1);
  uint8_t* static_base(SeqId seq, uint32_t layer) {
    return static_.get() + seq * lay_.static_seq_bytes + lay_.static_offset[layer];
  }
  uint32_t buffer_slot(uint64_t visit) const { return buffer_slots_[visit % buffer_slots_.size()]; }
  uint8_t* buffer(uint64_t visit) { return staging_->data(buffer_slot(visit)); }
  // Appends the extent [home_offset, +bytes) <-> buf (one plane's rows: consecutive home blocks) to
  // copies_.
  void add_copy(uint64_t home_offset, uint8_t* buf, uint64_t bytes, size_t& n);
  // this_pass: the visit belongs to the open pass (infinigen may then load its chosen rows only).
  void submit_load(uint64_t visit, SeqId seq, size_t unit_index, int64_t rows, bool this_pass);
  // infinigen (tiered_kv_infinigen.cpp). Speculation runs on decode passes for layers >= 2 without a
  // window of their own; layer l's runs in write(l - 1) from that layer's normed input (the look-ahead),
  // before attend(l - 1) submits layer l's load.
  struct Speculation {
    uint64_t pass = 0;  // passes_ of the pass it was made for (0: none)
    uint32_t layer = 0;
    policy::SpecResult r;         // sequence s of the batch is r's sequence s
    std::vector<int64_t> n_past;  // [batch] T of each sequence
  };
  bool infinigen() const { return pk_ != nullptr; }
  // retention pool (tiered_kv_infinigen.cpp): a layer that speculates keeps C = lay_.ig_pool_slots rows
  // per (sequence, KV head); row r of its home planes is slot r. A sequence's positions fill slots
  // 0, 1, ... (slot = position) until the pool is full; then each new token (a decode step) takes the
  // slot of a victim per KV head (policy::PoolSlots), its row staged at row C of the unit's buffer.
  bool pooled(uint32_t layer) const { return lay_.ig_pool_slots > 0 && speculates(layer); }
  // Rows a pass at `pos` finds in the layer (the live slots), where its new rows are staged.
  int64_t pool_row(uint32_t layer, int64_t pos) const {
    return pooled(layer) ? std::min(pos, lay_.ig_pool_slots) : pos;
  }
  // Does a pass of n tokens at `pos` evict in the layer (its pool fills before the pass ends)? Such a
  // visit attends the live slots and the pass's rows staged after them (a victim's old row is still
  // attended in that pass), then copies the staged rows into their slots (pool_patch) and stores
  // those slots' rows (pool_store): after the attention, on a host or a disk home alike.
  bool pool_evicts(uint32_t layer, int64_t pos, int64_t n) const {
    return pooled(layer) && pos + n > lay_.ig_pool_slots;
  }
  policy::PoolSlots& pool(SeqId seq, uint32_t layer, uint32_t g) {
    return pools_[seq * pool_heads_ + pool_head0_[layer] + g];
  }
  // The slot the pass's row `row` (its index in the pass, all sequences) takes in KV head g of `layer`
  // (pool_insert; the layers of the open pass alternate between two tables, so that layer l + 1's slots,
  // chosen in write(l) for its selective load, do not overwrite layer l's before attend(l) used them).
  int32_t& pool_slot(uint32_t layer, int64_t row, uint32_t g) {
    return pool_slot_[((layer % 2) * static_cast<size_t>(opt_.max_new_rows) + static_cast<size_t>(row)) *
                          lay_.h_max +
                      g];
  }
  void pool_check(std::span<const SeqPass> seqs) const;  // begin_batch: passes the pools can take
  // The pass's tokens into the layer's pools (once per pass: after the layer's speculation, in
  // write(layer - 1), or in write(layer)).
  void pool_insert(uint32_t layer);
  void pool_reset(SeqId seq, int64_t n);  // truncate/abort: the pools hold [0, n)
  // Does this visit of the layer weigh its rows for a prefill eviction (§15.13: a pooled layer, a
  // prefill pass, an eviction that reads the weights)? attend_unit then has the attention's
  // log-sum-exp written to pool_lse_ and pool_add_mass adds each row's softmax mass to its slot.
  bool pool_weighs(uint32_t layer) const { return pooled(layer) && pass_n_ > 1 && !pool_lse_.empty(); }
  void pool_add_mass(const cpu::AttnParams& ap, const cpu::AttnQueries& aq, const cpu::KvSpan& span,
                     const policy::Unit& u);
  // An evicting visit, after its attention: the pass's rows staged at rows [row0, row0 + n) of the
  // unit's planes into their slots (in pass order: a slot taken twice in one pass keeps the later row).
  void pool_patch(uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t row0, int64_t n);
  // The store of the slots pool_patch wrote: per head and page, the rows from the first to the last
  // slot written (page-rounded on a disk home: the load brought the victim's I/O page, add_chosen_rows).
  void pool_store(uint8_t* base, const policy::Unit& u, int64_t n, size_t& n_blocks);
  void pool_stats(InfinigenStats& s) const;
  bool speculates(uint32_t layer) const { return infinigen() && layer >= 2 && geo_.window_of(layer) == 0; }
  void infinigen_init(uint32_t n_head, MemoryLedger& ledger);
  void infinigen_begin();  // begin_batch: the columns and partial keys of prompts that end now
  void infinigen_write(uint32_t layer, const LayerRows& rows);
  void infinigen_observe(uint32_t layer, const float* q, const LayerAttention& la);
  void build_partial_keys(SeqId seq, int64_t rows);
  // quest (tiered_kv_quest.cpp): the query is known when a layer attends, so a decode step's load of a
  // layer that selects waits for that (no prefetch); the selected rows go through the infinigen path
  // (a Speculation: add_chosen_rows loads them, compact_unit gathers them).
  bool quest() const { return opt_.selection == policy::Selection::kQuest; }
  bool selects() const { return infinigen() || quest(); }  // chosen rows may replace the whole unit
  void quest_init(MemoryLedger& ledger);
  // Does a decode query at position end - 1 of `layer` attend selected pages (not every position)?
  bool quest_selects(uint32_t layer, int64_t end) const;
  // Must the load of `layer` for sequence pass `sp` wait for the layer's selection (this pass), or for a
  // next pass's query (this_pass false: the next pass assumed a decode step)?
  bool quest_waits(uint32_t layer, const SeqPass& sp, bool this_pass) const;
  void quest_write(uint32_t layer, const LayerRows& rows);
  // attend(): the layer's pages per batch entry and KV head, as the layer's Speculation.
  void quest_select(uint32_t layer, const float* q, int64_t n_head);
  // The open pass's speculation for `layer`, or null.
  const Speculation* speculation(uint32_t layer) const;
  // Appends the loads of the chosen rows of KV head `head` (index g of the speculation) of batch entry
  // b, and of the rows the visit's store will write back around the new rows.
  // On a disk home, an evicting pass's victim slot `victim` (-1: none) of that head too: its store
  // rewrites the slot's whole I/O page.
  void add_chosen_rows(const Speculation& s, uint32_t b, SeqId seq, uint32_t layer, uint32_t head,
                       uint8_t* base_k, uint8_t* base_v, int64_t rows, int32_t victim, size_t& n);
  // The unit's chosen rows and the pass's new row of batch entry b in compact planes; returns how
  // many chosen rows (-1: every row is chosen, attend the buffer as it is).
  int64_t compact_unit(const uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0, int64_t n);
  // The units of `layer` for the batch's sequence `sp` (pass_seq_, pass_pos0_, pass_n_ set to it).
  void attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o);
  // keep_own_next: leave out this unit's own next visit (its store is submitted after the attention).
  void prefetch_ahead(uint64_t visit, bool keep_own_next = false);
  void scatter_new_rows(uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0, int64_t n);
  void attend_unit(const uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0, int64_t n,
                   const float* q, int64_t n_head, const LayerAttention& la, float* o);

  // locret (tiered_kv_locret.cpp): Locret's retention on the offloaded placement. length_ counts the rows
  // each (layer, KV head) holds, at compact positions (row i at position i) as in LocretKv; the home
  // tier holds their K (after RoPE) and V and moves them like any rows. Eviction decisions are
  // LocretKv's (locret_mark_keep) over scores kept in host memory beside the home tier, with each
  // row's pre-RoPE key, from which a moved row's key is re-rotated (KvCompute::rope_k_rows; with
  // --locret-keys rerotate no copy: the moved key itself is turned by the distance it moved). An
  // eviction (after a chunk of the prefill plan, or before a pass that would overflow the rows) loads
  // each unit's rows, compacts them in the staging buffer and stores the rows that changed.
  bool locret() const { return opt_.retention == policy::Retention::kLocret; }
  void locret_init(MemoryLedger& ledger);
  void locret_begin(std::span<const PassInfo> seqs);  // evictions of passes that would overflow
  void locret_write(uint32_t layer, const LayerRows& rows);
  void locret_end_pass();  // the prefill plan's evictions
  // Will the open pass's sequence `sp` evict when the pass ends (its next pass then starts anew)?
  bool locret_evicts_after(const SeqPass& sp) const;
  int64_t locret_truncate(SeqId seq, int64_t n);  // the compact row count for true length n
  // Keeps `keep` of the sequence's rows in every (layer, KV head) (the last n_protect protected).
  void locret_evict(SeqId seq, int64_t keep, int64_t n_protect);
  // Compacts rows [0, n) of the unit's heads in a staging buffer (or static planes) to their `keep`
  // best; returns the first row whose bytes changed.
  int64_t locret_compact_unit(uint8_t* base, uint64_t pitch, const policy::Unit& u, SeqId seq, int64_t n,
                              int64_t keep, int64_t n_protect);
  size_t lr_cell(SeqId seq, uint32_t layer, int64_t head) const {  // first row of (seq, layer, head)
    return ((static_cast<size_t>(seq) * geo_.n_layer() + layer) * lay_.h_max + static_cast<size_t>(head)) *
           static_cast<size_t>(lr_cap_);
  }

  KvGeometry geo_;
  int64_t capacity_;
  ThreadPool& threads_;
  cpu::Isa isa_;
  TieredOptions opt_;
  policy::KvShape shape_;
  size_t esz_;
  uint64_t row_max_;             // bytes of the longer of a K and a V row
  TieredLayout lay_;             // sizes of everything below
  std::vector<int64_t> length_;  // [n_seqs] positions each sequence holds
  PassState pass_;

  std::unique_ptr<HomeStore> home_;
  uint64_t home_block_bytes_ = 0;      // pin granularity: block_tokens rows of one plane, page-rounded
  Reservation home_pins_reservation_;  // the engine's pin counts of the home blocks
  Reservation table_reservation_;      // pages_ and free_pages_
  Reservation copy_reservation_;       // the engine's and copies_' extent lists
  BlockTable pages_;                   // (seq, layer, token block) -> page index in the layer's regions
  std::vector<std::vector<uint32_t>> free_pages_;   // [n_layer] free page indices (a stack)
  cpu::KiviFormat kivi_;                            // bits 0: f16 / f32 rows only
  BlockTable qpages_;                               // KIVI: (seq, layer, token block) -> quantised page
  std::vector<std::vector<uint32_t>> free_qpages_;  // KIVI: [n_layer] free quantised pages
  std::vector<int64_t> qend_;                       // KIVI: [n_seqs] positions below are quantised
  std::unique_ptr<TransferEngine> engine_;

  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<BlockPool> staging_;  // [n_buffers] staging buffers of buffer_bytes, page-aligned
  std::vector<uint32_t> buffer_slots_;  // [n_buffers] the pool's slots, used round-robin by visit
  Reservation static_reservation_;
  std::unique_ptr<uint8_t, FreeDeleter> static_;  // [sum static heads][K,V][static_pitch]
  Reservation staging_reservation_;
  std::vector<uint8_t> new_k_;   // [max_new_rows, max heads, head_dim_k] KV dtype
  std::vector<uint8_t> new_v_;   // [max_new_rows, max heads, head_dim_v] KV dtype
  std::vector<uint8_t> new_x_;   // kvpr: [max_new_rows, act_row_bytes(layer)] the pass's encoded inputs
  std::vector<float> re_k_;      // kvpr: [recompute_rows, max heads, head_dim_k] f32 recomputed K
  std::vector<float> re_v_;      // kvpr: [recompute_rows, max heads, head_dim_v] f32 recomputed V
  std::vector<int64_t> re_pos_;  // kvpr: [recompute_rows] their positions
  Reservation scratch_reservation_;
  std::vector<uint8_t> scratch_;
  std::vector<BlockCopy> copies_;  // [max_copies] extents of one job
  StreamingBuffers streaming_;     // retention streaming: the sink attention's buffers
  KvCompute* compute_ = nullptr;   // the model's hook (streaming re-rotates queries)
  const float* q_pre_ = nullptr;   // kNeedPreRope: the open layer's queries before RoPE

  // The current pass.
  policy::PassPlan plan_;
  Layout layout_;
  uint64_t epoch_ = 0;  // bumps when the layout changes (prefetches of older epochs are void)
  // The batch's sequence being visited (a pass of one sequence: that sequence all along).
  SeqId pass_seq_ = 0;
  int64_t pass_pos0_ = -1;
  int64_t pass_n_ = 0;
  int64_t pass_row0_ = 0;  // its first row in the pass (in new_k_ / new_v_)
  // The pass's offloaded visits in order: (index in the batch, index into plan_.units). Layers in
  // order; in each layer, the batch's sequences in order; in each, the layer's offloaded units.
  struct VisitSlot {
    uint32_t b = 0;
    size_t unit = 0;
  };
  std::vector<VisitSlot> visit_order_;  // [batch * offloaded units], capacity kept across passes
  std::vector<uint32_t> seq_order_;     // [batch] batch indices in visit order (plan_mini_batches)
  std::vector<size_t> first_unit_;      // [n_layer] index into plan_.units of the layer's first unit
  std::vector<size_t> offloaded_;       // indices into plan_.units of the offloaded units, in order
  uint64_t next_visit_ = 0;             // visit counter (offloaded units only)
  uint64_t pass_first_visit_ = 0;       // visit of the pass's first offloaded unit
  std::vector<Visit> inflight_;         // loads submitted for visits >= next_visit_, in visit order
  uint64_t passes_ = 0;
  uint64_t sync_loads_ = 0;
  uint64_t recomputed_rows_ = 0;
  double act_ratio_ = 0;                                       // hybrid: R
  uint64_t mb_passes_ = 0, mb_formed_ = 0, mb_reordered_ = 0;  // hybrid: Algorithm 2 (TieredStats)
  uint32_t mb_last_ = 0, mb_last_seqs_ = 0;
  bool mb_balanced_ = false;
  std::vector<uint8_t> act_blocks_;  // hybrid: [max blocks of a sequence] 1 = ACT block
  int64_t last_split_ = 0;
  std::vector<int64_t> pass_splits_;  // [passes] (kvpr)
  // kvpr auto: the compute between two decode unit visits besides waiting and recomputing (seconds, a
  // moving average): the transfer it hides needs no recompute (policy::KvprSchedule::kPipelined's W).
  bool time_visits() const { return kvpr() && opt_.knobs.recompute < 0; }
  double hidden_s_ = 0;
  double hidden_seed_ = 0;        // W until hidden_s_ is measured (policy::kvpr_hidden_estimate; 0: none)
  double prev_visit_start_ = -1;  // steady clock of the last visit's start (-1: none yet)
  double prev_blocked_s_ = 0;     // its waiting and recomputing
  // kvpr auto: measured seconds to recompute one row of a whole layer's K/V (a moving average over
  // visits that recompute; 0: none yet, the profile's rate is used). The profile is taken once, on
  // other load and with another call shape; the split follows what recomputing costs now (spec P6).
  double recompute_s_per_row_ = 0;
  std::vector<int64_t> x_end_;  // kvpr: [n_seqs * n_layer] see x_end()
  uint64_t payload_x_bytes_ = 0;
  uint64_t payload_kv_bytes_ = 0;

  // infinigen
  std::unique_ptr<PartialKeys> pk_;
  Reservation ig_reservation_;          // the scratch below (tiered_layout's ig_scratch_bytes)
  std::vector<uint8_t> cols_chosen_;    // [n_seqs] the prompt's columns are chosen (decoding)
  std::vector<float> layer_scale_;      // [n_layer] the attention scale a layer was last attended with
  Speculation spec_[2];                 // layers l and l + 1 of the open pass (index layer % 2)
  const float* new_k_f32_ = nullptr;    // the open layer's new keys: [n, n_head_kv, head_dim_k] f32
  std::vector<float> la_q_;             // [batch, n_head, head_dim_k] f32 the look-ahead's queries
  std::vector<float> la_qp_;            // [batch, n_head, ig_cols] f32 their partial queries
  std::vector<int64_t> la_pos_;         // [batch]
  std::vector<const uint16_t*> la_pk_;  // [batch * n_head_kv]
  std::vector<int64_t> la_cap_;         // [batch]
  std::vector<uint8_t> compact_;        // [2 * h_max][ig_rows rows] KV dtype: a unit's chosen rows
  uint64_t compact_pitch_ = 0;
  std::unique_ptr<uint8_t, FreeDeleter>
      key_page_;                // [h_max][page] one block of keys per head (4 KiB-aligned)
  std::vector<float> key_f32_;  // [block_tokens, n_head_kv, head_dim_k] f32
  uint32_t ig_n_head_ = 0;      // query heads
  InfinigenStats ig_;
  // retention pool
  std::vector<policy::PoolSlots> pools_;  // [n_seqs, pool_heads_] one per (sequence, pooled layer, KV head)
  std::vector<size_t> pool_head0_;        // [n_layer] the layer's first pool within a sequence's
  size_t pool_heads_ = 0;                 // pools per sequence
  std::vector<int32_t> pool_slot_;        // [2][max_new_rows, h_max] slots of the pass's rows (pool_slot())
  std::vector<float> pool_lse_;          // [max_new_rows, n_head] a prefill visit's log-sum-exp (empty: FIFO)
  std::vector<float> pool_mass_;         // [h_max, C + max_new_rows] the visit's mass per staged row
  std::vector<uint64_t> pool_ins_pass_;  // [n_layer] the pass whose rows the layer's pools took (passes_)
  std::vector<int64_t> pool_dirty_;      // [2 * pages of a pool] pool_store's first and last slot per page
  std::vector<uint8_t> pool_broken_;     // [n_seqs] an aborted pass evicted: truncate to 0 first

  // quest
  QuestIndex quest_;                    // per-page key bounds (compute-local KV)
  Reservation quest_reservation_;       // quest_ (lay_.quest_bytes)
  std::vector<PosRange> quest_ranges_;  // [pages] QuestIndex::select scratch
  std::vector<int64_t> quest_order_;    // [pages]
  std::vector<float> quest_bound_;      // [pages]
  QuestStats qs_;

  // locret
  int64_t lr_cap_ = 0;      // rows per (sequence, layer, KV head): locret_rows()
  int64_t lr_protect_ = 0;  // n_s
  int64_t lr_n_head_ = 0;   // query heads
  std::shared_ptr<UnitScorer> lr_scorer_;
  Reservation lr_reservation_;          // everything below (host: locret_side_bytes)
  std::vector<float> lr_score_;         // [n_seqs][n_layer][h_max][cap] f32 each row's score
  std::vector<uint8_t> lr_kpre_;        // [n_seqs][n_layer][h_max][cap][head_dim_k] KV dtype, before RoPE
                                        // (empty with --locret-keys rerotate)
  std::vector<int64_t> lr_len_;         // [n_seqs] tokens each sequence has seen
  std::vector<int64_t> lr_plan_end_;    // [n_seqs] true position where the evicting prefill ends (0: none)
  std::vector<int64_t> lr_evicted_at_;  // [n_seqs] length when the sequence last evicted
  std::vector<float> lr_pass_scores_;   // [max_new_rows, h_max] f32 the pass's scores
  std::vector<uint8_t> lr_keep_;        // [cap]
  std::vector<int64_t> lr_order_;       // [cap]
  std::vector<uint8_t> lr_link_;        // [n_seqs][n_layer][h_max][cap] BoundedRows::link (--locret-span
                                        // word|number; empty otherwise)
  std::vector<float> lr_span_best_;     // [cap] the eviction's span scores (spans only)
  std::vector<uint8_t> lr_pass_link_;   // [max_new_rows] the pass's links, in batch order (spans only)
  std::vector<uint8_t> lr_last_edges_;  // [n_seqs] TokenEdge bits of each sequence's last token
  std::vector<uint8_t> lr_pass_edges_;  // [n_seqs] those after the open pass
  std::vector<float> lr_rot_in_, lr_rot_out_;  // [cap, head_dim_k] f32 keys being re-rotated
  std::vector<int64_t> lr_rot_pos_;            // [cap] the angle's position (prerope: row; rerotate: w - r)
  std::vector<int64_t> lr_rot_row_;            // [cap] their new rows
  uint64_t lr_evictions_ = 0;
};

}  // namespace kvtier::kv
