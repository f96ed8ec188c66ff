#include "kv/footprint.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/align.h"
#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/h2o_kv.h"
#include "kv/locret_kv.h"
#include "kv/page_extents.h"
#include "kv/quest_index.h"
#include "kv/streaming_attend.h"
#include "kv/transfer_engine.h"
#include "policy/kivi.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

std::vector<uint32_t> groups_heads(const KvGeometry& geo) {
  return std::vector<uint32_t>(geo.n_head_kv.begin(), geo.n_head_kv.end());
}

}  // namespace

int64_t max_new_rows(int64_t capacity, const KvOptions& o) {
  return o.max_new_rows > 0 ? o.max_new_rows : capacity;
}

int64_t tiered_home_rows(int64_t capacity, const KvOptions& o) {
  return o.retention == policy::Retention::kLocret ? locret_rows(capacity, o) : capacity;
}

int64_t layer_blocks(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o) {
  const int64_t max_blocks = (capacity + geo.block_tokens - 1) / geo.block_tokens;
  const int64_t max_new = max_new_rows(capacity, o);
  const int64_t window = geo.window_of(layer);
  switch (o.retention) {
    case policy::Retention::kSliding:
      return policy::sliding_blocks(window, max_new, geo.block_tokens, max_blocks);
    case policy::Retention::kStreaming:  // a layer with its own window keeps it (sliding); others stream
      if (window > 0) return policy::sliding_blocks(window, max_new, geo.block_tokens, max_blocks);
      return policy::streaming_blocks(o.knobs.sinks, policy::streaming_window(o.knobs), max_new,
                                      geo.block_tokens, max_blocks);
    default:
      return max_blocks;
  }
}

uint64_t retention_scratch(const KvGeometry& geo, int64_t capacity, uint32_t n_head, const KvOptions& o) {
  if (o.retention != policy::Retention::kStreaming) return 0;
  return StreamingBuffers::bytes(max_new_rows(capacity, o), n_head, geo.head_dim_k, geo.head_dim_v,
                                 policy::streaming_sink_blocks(o.knobs.sinks, geo.block_tokens),
                                 (capacity + geo.block_tokens - 1) / geo.block_tokens);
}

cpu::KiviFormat kivi_format_of(const KvGeometry& geo, const KvOptions& o) {
  const int bits = policy::kivi_bits(o.representation);
  if (bits == 0) return {};
  if (geo.dtype != cpu::KvDtype::kF16)
    fail(ErrorKind::kInvalidArgument, "KIVI keeps its residual rows in f16");
  if (o.knobs.kivi_residual < 0)
    fail(ErrorKind::kInvalidArgument, "--kivi-residual {}: must be >= 0", o.knobs.kivi_residual);
  return cpu::kivi_format(bits, geo.block_tokens, o.knobs.kivi_group, geo.head_dim_k, geo.head_dim_v);
}

int64_t kivi_layer_f16_blocks(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o) {
  const int64_t max_new = o.max_new_rows > 0 ? o.max_new_rows : capacity;
  return policy::kivi_f16_blocks(o.knobs.kivi_residual, o.knobs.kivi_group, max_new, geo.block_tokens,
                                 layer_blocks(geo, layer, capacity, o));
}

ResidentLayout resident_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                               const KvOptions& o) {
  geo.validate();
  if (capacity <= 0) fail(ErrorKind::kInvalidArgument, "KV capacity of {} positions", capacity);
  if (o.max_seqs == 0) fail(ErrorKind::kInvalidArgument, "a KV cache for 0 sequences");
  const cpu::KiviFormat kivi = kivi_format_of(geo, o);
  ResidentLayout r;
  r.max_blocks = (capacity + geo.block_tokens - 1) / geo.block_tokens;
  std::vector<uint64_t> counts;
  std::vector<uint32_t> groups;
  // Blocks of `bytes` each, `blocks` per (sequence, group) of layer l: into the pool of that size.
  auto add = [&](uint32_t l, uint64_t bytes, int64_t blocks) {
    auto it = std::find(r.pool_block_bytes.begin(), r.pool_block_bytes.end(), bytes);
    if (it == r.pool_block_bytes.end()) {
      r.pool_block_bytes.push_back(bytes);
      counts.push_back(0);
      it = r.pool_block_bytes.end() - 1;
    }
    const auto pi = static_cast<uint32_t>(it - r.pool_block_bytes.begin());
    counts[pi] += uint64_t{o.max_seqs} * geo.n_groups(l) * static_cast<uint64_t>(blocks);
    return pi;
  };
  for (uint32_t l = 0; l < geo.n_layer(); ++l) {
    if (kivi.bits == 0) {
      r.pool_index.push_back(add(l, geo.block_bytes(l), layer_blocks(geo, l, capacity, o)));
    } else {  // f16 blocks for the residual window, quantised blocks for the rest
      r.pool_index.push_back(add(l, geo.block_bytes(l), kivi_layer_f16_blocks(geo, l, capacity, o)));
      const uint64_t qbytes = uint64_t{geo.heads_per_group(l)} *
                              (cpu::kivi_block_bytes(kivi, cpu::KiviPlane::kKey, geo.head_dim_k) +
                               cpu::kivi_block_bytes(kivi, cpu::KiviPlane::kValue, geo.head_dim_v));
      r.quant_pool_index.push_back(add(l, qbytes, layer_blocks(geo, l, capacity, o)));
    }
    groups.push_back(geo.n_groups(l));
  }
  r.table_bytes = BlockTable::bytes(o.max_seqs, groups, r.max_blocks) * (kivi.bits == 0 ? 1 : 2);
  if (o.selection == policy::Selection::kQuest) {
    if (o.knobs.quest_page < 1 || geo.block_tokens % o.knobs.quest_page != 0) {
      fail(ErrorKind::kInvalidArgument, "--quest-page {} must divide the KV block of {} tokens",
           o.knobs.quest_page, geo.block_tokens);
    }
    const auto pages = static_cast<uint64_t>((capacity + o.knobs.quest_page - 1) / o.knobs.quest_page);
    r.selection_bytes =
        QuestIndex::bytes(o.max_seqs, groups_heads(geo), capacity, o.knobs.quest_page, geo.head_dim_k) +
        pages * (sizeof(PosRange) + sizeof(int64_t) + sizeof(float)) +
        (pages + static_cast<uint64_t>(r.max_blocks)) * sizeof(cpu::KvSpan);
  }
  r.kv_bytes = r.table_bytes + static_cast<uint64_t>(r.max_blocks) * sizeof(cpu::KvSpan) + r.selection_bytes;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0xfffffff0u) fail(ErrorKind::kBudget, "{} KV blocks are too many", counts[i]);
    r.pool_blocks.push_back(static_cast<uint32_t>(counts[i]));
    r.kv_bytes += BlockPool::slab_bytes(r.pool_block_bytes[i], r.pool_blocks[i]);
  }
  r.retention_bytes = retention_scratch(geo, capacity, n_head, o);
  r.scratch_bytes = geo.attention_scratch_bytes(n_head, threads) + r.retention_bytes;
  return r;
}

StagingPlanes staging_planes(const TieredLayout& t, const KvGeometry& geo, uint64_t buffer_bytes,
                             uint32_t group) {
  const uint64_t row_max = std::max(geo.head_dim_k, geo.head_dim_v) * cpu::kv_dtype_bytes(geo.dtype);
  StagingPlanes s;
  if (t.xpage_bytes != 0) {
    // kvpr: whole blocks; per block, each head's two planes' rows (and with KIVI its quantised page),
    // and one page of the unit's inputs.
    const uint64_t blocks =
        buffer_bytes / (group * (2ull * geo.block_tokens * row_max + t.qpage_bytes) + t.xpage_bytes);
    s.rows = static_cast<int64_t>(blocks * geo.block_tokens);
    s.pitch = blocks * geo.block_tokens * row_max;
    s.qpitch = blocks * t.qpage_bytes;
    s.xpitch = blocks * t.xpage_bytes;
    return s;
  }
  if (t.kivi.bits == 0) {
    s.pitch = round_down(buffer_bytes / (2ull * group), kPageAlign);
    s.rows = static_cast<int64_t>(s.pitch / row_max);
    return s;
  }
  // Whole blocks: per block_tokens rows, two f16 planes' rows and two quantised pages.
  const uint64_t per_block = 2 * geo.block_tokens * row_max + t.qpage_bytes;
  const uint64_t blocks = buffer_bytes / group / per_block;
  s.rows = static_cast<int64_t>(blocks * geo.block_tokens);
  s.pitch = blocks * geo.block_tokens * row_max;
  s.qpitch = blocks * t.qpage_bytes;
  return s;
}

bool infinigen_speculates(const KvGeometry& geo, uint32_t layer) {
  return layer >= 2 && geo.window_of(layer) == 0;
}

int64_t infinigen_pool_slots(const KvGeometry& geo, int64_t capacity, const KvOptions& o) {
  if (o.retention != policy::Retention::kPool || o.knobs.pool_limit == 0) return 0;
  uint64_t heads = 0;  // KV heads of the layers that speculate (the pooled ones)
  for (uint32_t l = 0; l < geo.n_layer(); ++l)
    if (infinigen_speculates(geo, l)) heads += geo.n_head_kv[l];
  if (heads == 0) return 0;
  const uint64_t row = std::max(geo.head_dim_k, geo.head_dim_v) * cpu::kv_dtype_bytes(geo.dtype);
  const int64_t slots = policy::pool_slots(o.knobs.pool_limit, 1, std::max<uint32_t>(o.max_seqs, 1),
                                           static_cast<int64_t>(heads), row);
  if (slots < 1) {
    const uint64_t need = uint64_t{std::max<uint32_t>(o.max_seqs, 1)} * heads * 2 * row;
    fail(ErrorKind::kBudget,
         "--kv-pool-limit {} bytes cannot hold one slot per (layer, sequence, KV head): the pool's K and V "
         "rows of {} sequence(s) x {} KV heads of the layers that speculate x 2 x {} bytes need at least {} "
         "bytes",
         o.knobs.pool_limit, std::max<uint32_t>(o.max_seqs, 1), heads, row, need);
  }
  if (slots >= capacity) return 0;  // as many slots as positions: nothing to bound
  // The home tier holds whole pages of block_tokens rows: from one page on, the slots fill whole pages,
  // so that the pool's rows stay within the limit (below one page, that page is the smallest unit).
  const int64_t slots_paged = slots >= geo.block_tokens ? slots - slots % geo.block_tokens : slots;
  return slots_paged;
}

TieredLayout tiered_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                           const TieredOptions& o) {
  geo.validate();
  if (capacity <= 0) fail(ErrorKind::kInvalidArgument, "KV capacity of {} positions", capacity);
  if (o.placement.placement == policy::Placement::kResident) {
    fail(ErrorKind::kInvalidArgument, "TieredKv serves offloaded placements, not resident");
  }
  if (o.placement.prefetch_depth == 0) fail(ErrorKind::kInvalidArgument, "prefetch depth must be at least 1");
  if (o.max_seqs == 0) fail(ErrorKind::kInvalidArgument, "a KV cache for 0 sequences");
  const int64_t max_new_rows = o.max_new_rows > 0 ? o.max_new_rows : capacity;
  const uint32_t L = geo.n_layer();
  const uint64_t esz = cpu::kv_dtype_bytes(geo.dtype);
  const uint64_t row_max = std::max(geo.head_dim_k, geo.head_dim_v) * esz;
  TieredLayout t;
  t.kivi = kivi_format_of(geo, o);
  t.h_max = *std::max_element(geo.n_head_kv.begin(), geo.n_head_kv.end());
  for (uint32_t l = 0; l < L; ++l) {
    t.head_offset.push_back(t.n_heads_total);
    t.n_heads_total += geo.n_head_kv[l];
  }
  t.retention_bytes = retention_scratch(geo, capacity, n_head, o);
  t.scratch_bytes = geo.attention_scratch_bytes(n_head, threads) + t.retention_bytes;

  policy::KvShape shape;
  shape.n_head_kv = geo.n_head_kv;
  shape.head_bytes_per_token = 2 * row_max;
  t.static_heads = policy::static_heads_per_layer(o.placement, shape);
  t.static_pitch = round_up(static_cast<uint64_t>(capacity) * row_max, 64);
  for (uint32_t l = 0; l < L; ++l) {
    t.static_offset.push_back(t.static_seq_bytes);
    t.static_seq_bytes += uint64_t{t.static_heads[l]} * 2 * t.static_pitch;
  }
  t.static_bytes = t.static_seq_bytes * o.max_seqs;
  if (t.kivi.bits != 0 && t.static_seq_bytes != 0) {
    fail(ErrorKind::kUnsupported,
         "--static-heads with a KIVI representation: static heads keep f16 rows; use --static-heads 0");
  }
  if (t.kivi.bits != 0) {
    const QpageSize q = kivi_qpage_size(t.kivi, geo);
    t.qpage_v_offset = q.v_offset;
    t.qpage_bytes = q.bytes;
  }
  t.staging_bytes = static_cast<uint64_t>(max_new_rows) * t.h_max * (geo.head_dim_k + geo.head_dim_v) * esz;
  if (policy::stores_inputs(o.representation)) {
    if (geo.act_row_bytes.size() != L) {
      fail(ErrorKind::kInvalidArgument,
           "kvpr needs the size of each layer's stored K/V-projection inputs (the model's; this KV geometry "
           "has none)");
    }
    t.xrow_bytes = *std::max_element(geo.act_row_bytes.begin(), geo.act_row_bytes.end());
    t.xpage_bytes = round_up(uint64_t{geo.block_tokens} * t.xrow_bytes, kPageAlign);
    // The pass's encoded inputs, and the recomputed K/V rows of one block (f32) of a layer's heads.
    t.recompute_rows = std::min<int64_t>(geo.block_tokens, max_new_rows);
    t.staging_bytes +=
        static_cast<uint64_t>(max_new_rows) * t.xrow_bytes +
        static_cast<uint64_t>(t.recompute_rows) * t.h_max * (geo.head_dim_k + geo.head_dim_v) * sizeof(float);
  }

  t.n_buffers = o.placement.prefetch_depth + 1;
  const bool layer_mode = o.placement.placement == policy::Placement::kLayer;
  const uint32_t g_min = layer_mode ? t.h_max : (o.placement.group ? o.placement.group : 1);
  const uint32_t g_pref = layer_mode ? t.h_max : (o.placement.group ? o.placement.group : t.h_max);
  const uint64_t plane_for_ctx = round_up(static_cast<uint64_t>(capacity) * row_max, kPageAlign);
  // One head's staging for the whole context (staging_planes): two f16 planes, and with KIVI two
  // quantised pages, in whole blocks.
  const uint64_t ctx_blocks = (capacity + geo.block_tokens - 1) / geo.block_tokens;
  // kvpr: whole blocks too, and per unit one plane of the inputs' pages.
  const bool whole_blocks = t.kivi.bits != 0 || t.xpage_bytes != 0;
  const uint64_t head_for_ctx =
      !whole_blocks ? 2 * plane_for_ctx : ctx_blocks * (2 * geo.block_tokens * row_max + t.qpage_bytes);
  const uint64_t unit_extra = ctx_blocks * t.xpage_bytes;
  const uint64_t need_buffer = g_min * head_for_ctx + unit_extra;
  const uint64_t fixed = t.static_bytes + t.staging_bytes + t.scratch_bytes;
  if (o.kv_mem == 0) {
    t.buffer_bytes = g_pref * head_for_ctx + unit_extra;
  } else {
    const uint64_t need = fixed + t.n_buffers * need_buffer;
    if (o.kv_mem < need) {
      fail(ErrorKind::kBudget,
           "--kv-mem {} bytes cannot hold {} staging buffer(s) of {} KV head(s) for {} positions plus static "
           "heads, new-row staging and scratch: {} bytes are needed ({} for the buffers, {} fixed); raise "
           "--kv-mem, lower --ctx{}",
           o.kv_mem, t.n_buffers, g_min, capacity, need, t.n_buffers * need_buffer, fixed,
           layer_mode ? ", or use --kv-policy headinfer" : ", lower --static-heads or the prefetch depth");
    }
    t.buffer_bytes = round_down((o.kv_mem - fixed) / t.n_buffers, kPageAlign);
    // No use holding more than the largest unit needs.
    t.buffer_bytes = std::min<uint64_t>(t.buffer_bytes, t.h_max * head_for_ctx + unit_extra);
  }
  // Home tier: per (layer, head, K|V) a region of pages of block_tokens rows; sliding retention needs
  // fewer pages on sliding-window layers (freed pages are reused), the sequences share the regions.
  t.max_blocks = (capacity + geo.block_tokens - 1) / geo.block_tokens;
  for (int kv = 0; kv < 2; ++kv) {
    t.page_bytes[kv] = uint64_t{geo.block_tokens} * (kv == 0 ? geo.head_dim_k : geo.head_dim_v) * esz;
    if (t.page_bytes[kv] % kPageAlign != 0) {
      fail(ErrorKind::kUnsupported,
           "KV blocks of {} tokens x {} bytes per row ({} bytes) are not a multiple of {} bytes: the "
           "offloaded "
           "placements move whole pages of the home tier",
           geo.block_tokens, t.page_bytes[kv] / geo.block_tokens, t.page_bytes[kv], kPageAlign);
    }
  }
  // infinigen's bounded pool: the layers that speculate hold ig_pool_slots rows per (sequence, KV head).
  t.ig_pool_slots = infinigen_pool_slots(geo, capacity, o);
  int64_t most_blocks = 0;
  std::vector<uint32_t> groups(L, 1);
  for (uint32_t l = 0; l < L; ++l) {
    int64_t blocks = layer_blocks(geo, l, capacity, o);
    if (t.ig_pool_slots > 0 && infinigen_speculates(geo, l))
      blocks = std::min(blocks, (t.ig_pool_slots + geo.block_tokens - 1) / geo.block_tokens);
    most_blocks = std::max(most_blocks, blocks);
    // KIVI: f16 pages for the residual window only, quantised pages for every block.
    const int64_t f16_blocks = t.kivi.bits == 0 ? blocks : kivi_layer_f16_blocks(geo, l, capacity, o);
    t.home_pages.push_back(static_cast<uint32_t>(int64_t{o.max_seqs} * f16_blocks));
    if (t.kivi.bits != 0) t.home_qpages.push_back(static_cast<uint32_t>(int64_t{o.max_seqs} * blocks));
    t.home_offset.push_back(t.home_bytes);
    // kvpr: after the heads' regions, the layer's inputs, one page per K/V page index (KIVI: per
    // quantised page index, as the f16 pages cover the residual window only).
    t.home_bytes += uint64_t{geo.n_head_kv[l]} * t.head_region_bytes(l) + t.xpages(l) * t.xpage_bytes;
  }
  // A job reads or writes at most the pages of one sequence's layer, one extent per page and plane
  // (KIVI: its f16 and its quantised pages; kvpr: its inputs' pages, and a load one more extent for
  // the I/O page of inputs around the rows the visit will store).
  t.max_copies =
      static_cast<uint32_t>(((t.kivi.bits == 0 ? 2ull : 3ull) * t.h_max + (t.xpage_bytes != 0 ? 1 : 0)) *
                                static_cast<uint64_t>(most_blocks) +
                            (t.xpage_bytes != 0 ? 1 : 0) +  // kvpr: the inputs' page around the new rows
                            // kivi+kvpr: the quantised page a split cuts, in two extents
                            (t.kivi.bits != 0 && t.xpage_bytes != 0 ? t.h_max : 0));
  uint64_t free_list = 0;
  for (uint32_t p : t.home_pages) free_list += uint64_t{p} * sizeof(uint32_t);
  for (uint32_t p : t.home_qpages) free_list += uint64_t{p} * sizeof(uint32_t);
  t.table_bytes =
      BlockTable::bytes(o.max_seqs, groups, t.max_blocks) * (t.kivi.bits == 0 ? 1 : 2) + free_list;
  if (t.ig_pool_slots >
      0) {  // the pools' slot metadata (policy::PoolSlots: position, counter, last use, mass)
    uint64_t heads = 0;
    for (uint32_t l = 0; l < L; ++l)
      if (infinigen_speculates(geo, l)) heads += geo.n_head_kv[l];
    t.table_bytes += uint64_t{o.max_seqs} * heads * static_cast<uint64_t>(t.ig_pool_slots) *
                     (2 * sizeof(int64_t) + sizeof(uint8_t) + sizeof(float));
    // TieredKv's slots of a pass's rows (two layers' tables) and the store's first/last slot per page.
    const auto pool_pages =
        static_cast<uint64_t>((t.ig_pool_slots + geo.block_tokens - 1) / geo.block_tokens);
    t.table_bytes += 2 * static_cast<uint64_t>(max_new_rows) * t.h_max * sizeof(int32_t) +
                     2 * pool_pages * sizeof(int64_t);
  }
  if (o.selection == policy::Selection::kInfinigen) {
    // Partial keys: per (sequence, layer, KV head) a row of ig_cols f16 per position (PartialKeys).
    t.ig_cols = o.skew ? int64_t{o.skew->partial_columns}
                       : static_cast<int64_t>(std::floor(0.3 * static_cast<double>(geo.head_dim_k)));
    t.ig_pk_bytes = uint64_t{o.max_seqs} * t.n_heads_total * static_cast<uint64_t>(ig_pk_slots(t, capacity)) *
                    static_cast<uint64_t>(t.ig_cols) * sizeof(uint16_t);
    // A decode step attends at most the cap's rows per KV head, plus its own.
    const auto cap =
        static_cast<int64_t>(std::floor(o.knobs.infinigen_budget * static_cast<double>(capacity)));
    t.ig_rows = std::min(capacity, std::max<int64_t>(cap, 1)) + 1;
    const uint64_t compact = 2ull * t.h_max * round_up(static_cast<uint64_t>(t.ig_rows) * row_max, 64);
    // The look-ahead's queries and partial queries of a batch, the chosen rows, the scores of every head,
    // one page of keys per head (the partial keys of a prompt are built from the home tier's keys).
    const uint64_t n_head_all = uint64_t{o.max_seqs} * n_head;
    const uint64_t look = n_head_all * (geo.head_dim_k + static_cast<uint64_t>(t.ig_cols)) * sizeof(float);
    const uint64_t chosen =
        uint64_t{o.max_seqs} * t.h_max * static_cast<uint64_t>(t.ig_rows) * sizeof(int32_t);
    // (two speculations live at once: layers l and l + 1).
    const uint64_t scores = 2 * static_cast<uint64_t>(capacity) *
                            (uint64_t{o.max_seqs} * t.h_max * sizeof(float) + sizeof(int32_t));
    const uint64_t keys = uint64_t{geo.block_tokens} * t.h_max * geo.head_dim_k * (esz + sizeof(float));
    // A pool that evicts a prompt by prefill attention weight (policy/kv_pool.h, §15.13): a prefill
    // visit's log-sum-exp and its mass per staged row (TieredKv::pool_add_mass).
    const uint64_t mass = t.ig_pool_slots > 0 && o.knobs.pool_eviction != policy::PoolEviction::kFifo &&
                                  o.knobs.pool_prefill == policy::PoolPrefill::kWeight
                              ? (static_cast<uint64_t>(max_new_rows) * n_head +
                                 t.h_max * static_cast<uint64_t>(t.ig_pool_slots + max_new_rows)) *
                                    sizeof(float)
                              : 0;
    t.ig_scratch_bytes = compact + look + chosen + scores + keys + mass;
    // A selective load moves one extent per chosen row and plane, and the I/O pages of the rows the
    // visit's store writes back.
    t.max_copies += static_cast<uint32_t>(2ull * t.h_max * static_cast<uint64_t>(t.ig_rows + 2));
  }
  if (o.selection == policy::Selection::kQuest) {
    if (o.knobs.quest_page < 1 || geo.block_tokens % o.knobs.quest_page != 0) {
      fail(ErrorKind::kInvalidArgument, "--quest-page {} must divide the KV block of {} tokens",
           o.knobs.quest_page, geo.block_tokens);
    }
    t.quest_bytes =
        QuestIndex::bytes(o.max_seqs, groups_heads(geo), capacity, o.knobs.quest_page, geo.head_dim_k);
    // A decode step attends at most max(budget, page) rows per KV head (whole pages, the newest one
    // partial), its own among them.
    t.ig_rows = std::min(capacity, std::max(o.knobs.budget, o.knobs.quest_page)) + 1;
    const uint64_t compact = 2ull * t.h_max * round_up(static_cast<uint64_t>(t.ig_rows) * row_max, 64);
    const uint64_t chosen =
        uint64_t{o.max_seqs} * t.h_max * static_cast<uint64_t>(t.ig_rows) * sizeof(int32_t);
    const auto pages = static_cast<uint64_t>((capacity + o.knobs.quest_page - 1) / o.knobs.quest_page);
    t.ig_scratch_bytes = compact + chosen + pages * (sizeof(PosRange) + sizeof(int64_t) + sizeof(float));
    t.max_copies += static_cast<uint32_t>(2ull * t.h_max * static_cast<uint64_t>(t.ig_rows + 2));
  }
  t.queue_slots = 4 * t.n_buffers + 4;
  t.copy_list_bytes = uint64_t{t.queue_slots + 1} * t.max_copies * sizeof(BlockCopy);
  // Pin granularity: every page boundary of either plane is a multiple of it.
  t.home_block_bytes = std::gcd(t.page_bytes[0], t.page_bytes[1]);
  if (t.qpage_bytes != 0) t.home_block_bytes = std::gcd(t.home_block_bytes, t.qpage_bytes);
  if (t.xpage_bytes != 0) t.home_block_bytes = std::gcd(t.home_block_bytes, t.xpage_bytes);
  t.home_pin_bytes = (t.home_bytes + t.home_block_bytes - 1) / t.home_block_bytes * sizeof(uint32_t);
  return t;
}

uint32_t kv_needs(const KvOptions& o) {
  // streaming re-rotates the queries that attend the sinks (from q before RoPE); kvpr stores the
  // K/V-projection inputs.
  uint32_t needs = o.retention == policy::Retention::kStreaming || o.retention == policy::Retention::kLocret
                       ? kNeedPreRope
                       : kNeedNone;
  if (policy::stores_inputs(o.representation)) needs |= kNeedLayerInput;
  // infinigen: layer l-1's normed input is the look-ahead's input for layer l (write(l - 1) gets it).
  if (o.selection == policy::Selection::kInfinigen) needs |= kNeedLayerInput;
  return needs;
}

void check_placement_options(const TieredOptions& o) {
  if (policy::stores_inputs(o.representation)) {
    if (o.placement.placement == policy::Placement::kResident) {
      fail(ErrorKind::kInvalidArgument,
           "kvpr recomputes part of the K/V that an offloaded placement would move: use --kv-policy kvpr "
           "(layer+kvpr), headinfer+kvpr or layer+{}, not resident+{}",
           policy::is_kivi(o.representation) ? policy::representation_name(o.representation) : "kivi4+kvpr",
           policy::representation_name(o.representation));
    }
    if (o.retention != policy::Retention::kNone && o.retention != policy::Retention::kSliding) {
      fail(ErrorKind::kInvalidArgument, "kvpr combines with retention none or sliding, not {}",
           policy::retention_name(o.retention));
    }
    if (o.selection != policy::Selection::kAll) {
      fail(ErrorKind::kInvalidArgument, "kvpr combines with selection all, not {}",
           policy::selection_name(o.selection));
    }
  }
  const bool kivi = policy::is_kivi(o.representation);
  if (kivi && (o.retention == policy::Retention::kStreaming || o.retention == policy::Retention::kH2o ||
               o.selection == policy::Selection::kQuest)) {
    fail(ErrorKind::kInvalidArgument,
         "{} does not combine with {} yet: each is built on f16 rows; use one of them (kivi with none or "
         "sliding "
         "retention and selection all)",
         policy::representation_name(o.representation),
         o.selection == policy::Selection::kQuest ? "quest" : policy::retention_name(o.retention));
  }
  if (o.selection == policy::Selection::kQuest && o.retention != policy::Retention::kNone &&
      o.retention != policy::Retention::kSliding) {
    fail(ErrorKind::kInvalidArgument,
         "quest selects among every stored token: combine it with retention none or sliding");
  }
  if (o.retention == policy::Retention::kLocret && (kivi || o.selection != policy::Selection::kAll)) {
    fail(ErrorKind::kInvalidArgument,
         "locret runs on the resident, layer and headinfer placements (host or --kv-disk home) with f16 or "
         "f32 rows and selection all; {}{} is not supported yet",
         kivi ? "a KIVI representation (" : "selection ",
         kivi ? std::string(policy::representation_name(o.representation)) + ")"
              : std::string(policy::selection_name(o.selection)));
  }
  if (o.selection == policy::Selection::kInfinigen) {
    if (o.placement.placement == policy::Placement::kResident) {
      fail(ErrorKind::kInvalidArgument,
           "infinigen selects which rows an offloaded placement loads: use --kv-policy infinigen "
           "(layer+infinigen) or headinfer+infinigen, not resident+infinigen (in a combination "
           "infinigen is the selection alone: name the placement, as in layer+infinigen+pool)");
    }
    if (o.representation != policy::Representation::kF16 &&
        o.representation != policy::Representation::kF32) {
      fail(ErrorKind::kInvalidArgument, "infinigen gathers f16 or f32 rows, not {}",
           policy::representation_name(o.representation));
    }
    if (o.retention != policy::Retention::kNone && o.retention != policy::Retention::kSliding &&
        o.retention != policy::Retention::kPool) {
      fail(ErrorKind::kInvalidArgument, "infinigen combines with retention none, sliding or pool, not {}",
           policy::retention_name(o.retention));
    }
  }
  if (o.retention == policy::Retention::kPool) {
    if (o.selection != policy::Selection::kInfinigen) {
      fail(ErrorKind::kInvalidArgument,
           "retention pool is InfiniGen's bounded pool and needs selection infinigen (--kv-policy "
           "layer+infinigen+pool or headinfer+infinigen+pool)");
    }
  }
  if (o.retention == policy::Retention::kH2o && o.placement.placement != policy::Placement::kResident) {
    fail(ErrorKind::kInvalidArgument,
         "h2o keeps --kv-budget rows per layer in compute-local memory and runs on the resident placement "
         "(--kv-policy h2o); offloading its bounded cache is not supported");
  }
  if (o.placement.placement != policy::Placement::kResident) return;
  if (!o.disk_dir.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "--kv-disk applies to the offloaded policies (layer, headinfer); resident keeps all KV in compute "
         "memory");
  }
  if (o.placement.static_heads != 0 || o.placement.group != 0) {
    fail(ErrorKind::kInvalidArgument, "--group and --static-heads apply to --kv-policy headinfer");
  }
}

void check_resident_budget(const ResidentLayout& r, int64_t capacity, uint64_t kv_mem) {
  const uint64_t need = r.kv_bytes + r.scratch_bytes;
  if (kv_mem != 0 && need > kv_mem) {
    fail(
        ErrorKind::kBudget,
        "resident KV for {} positions needs {} bytes ({} of KV blocks, {} of attention scratch) but --kv-mem "
        "is {} bytes; use --kv-policy layer or headinfer (KV offloaded to host memory or --kv-disk), raise "
        "--kv-mem, or lower --ctx",
        capacity, need, r.kv_bytes, r.scratch_bytes, kv_mem);
  }
}

KvFootprint kv_footprint(const TieredOptions& o, const KvGeometry& geo, int64_t capacity, uint32_t n_head,
                         int threads) {
  check_placement_options(o);
  KvFootprint f;
  const bool offloaded = o.placement.placement != policy::Placement::kResident;
  if ((o.retention == policy::Retention::kLocret && !offloaded) || o.retention == policy::Retention::kH2o) {
    const bool locret = o.retention == policy::Retention::kLocret;
    const BoundedLayout h = locret ? locret_layout(geo, capacity, n_head, threads, o)
                                   : h2o_layout(geo, capacity, n_head, threads, o);
    check_bounded_budget(locret ? "locret" : "h2o", h, o,
                         locret ? "--kv-budget, --local-tail or --chunk" : "--kv-budget or --chunk");
    f.device_kv = h.kv_bytes;
    f.device_scratch = h.scratch_bytes;
    return f;
  }
  if (o.placement.placement == policy::Placement::kResident) {
    const ResidentLayout r = resident_layout(geo, capacity, n_head, threads, o);
    check_resident_budget(r, capacity, o.kv_mem);
    f.device_kv = r.kv_bytes;
    f.device_scratch = r.scratch_bytes;
    return f;
  }
  const TieredLayout t = tiered_layout(geo, tiered_home_rows(capacity, o), n_head, threads, o);
  f.device_kv = t.static_bytes + uint64_t{t.n_buffers} * t.buffer_bytes + t.ig_pk_bytes + t.quest_bytes;
  f.device_staging = t.staging_bytes;
  f.device_scratch = t.scratch_bytes + t.ig_scratch_bytes;
  (o.disk_dir.empty() ? f.host_kv : f.disk_kv) = t.home_bytes;
  f.host_kv += t.home_pin_bytes + t.table_bytes + t.copy_list_bytes;
  // locret: the scores and pre-RoPE keys beside the home tier (TieredKv::locret_init)
  if (o.retention == policy::Retention::kLocret) f.host_kv += locret_side_bytes(geo, capacity, o);
  return f;
}

}  // namespace kvtier::kv
