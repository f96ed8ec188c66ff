#include "backend/cpu/matmul.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/act_panel.h"
#include "backend/cpu/dequant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/weight_lanes.h"
#include "core/error.h"

namespace kvtier::cpu {
namespace {

constexpr int64_t kTokenTile = 32;  // tokens per tile: their activations stay in L1/L2 across a row tile
// Tokens per tile of a product over the rows-in-lanes layout (a multiple of the kernels' passes).
constexpr int64_t kLanesTokenTile = 128;
// Weight bytes x tokens below which a sleeping pool's hand-off costs more than it saves
// (ThreadPool::threads_for; decode's per-layer matvecs are 0.2-1.7 MB).
constexpr int64_t kSleepingPoolMinBytes = int64_t{4} << 20;

VecDotFn dot_fn(const KernelTable& t, GgmlType type) {
  const VecDotFn fn = is_supported_weight_type(type) ? t.vec_dot[static_cast<size_t>(type)] : nullptr;
  if (fn == nullptr)
    fail(ErrorKind::kUnsupported, "CPU kernels do not support type {}", ggml_type_name(type));
  return fn;
}

}  // namespace

size_t matmul_scratch_bytes(GgmlType type, int64_t k, int64_t n_tokens) {
  const ActFormat f = act_format_for(type);
  if (k % act_block_size(f) != 0) {
    fail(ErrorKind::kInvalidArgument, "inner size {} is not a multiple of the {} block size", k,
         ggml_type_name(type));
  }
  if (f == ActFormat::kF32) return 0;  // f32 activations are used in place
  const size_t panels = act_panel_bytes_max(f, k, n_tokens);
  return act_row_bytes(f, k) * static_cast<size_t>(n_tokens) + panels;
}

float vec_dot(Isa isa, GgmlType type, const uint8_t* w_row, const uint8_t* act_row, int64_t k) {
  return dot_fn(kernel_table(isa), type)(w_row, act_row, k);
}

size_t act_row_bytes_for(GgmlType type, int64_t k) {
  const ActFormat f = act_format_for(type);
  if (k % act_block_size(f) != 0) {
    fail(ErrorKind::kInvalidArgument, "inner size {} is not a multiple of the {} block size", k,
         ggml_type_name(type));
  }
  return f == ActFormat::kF32 ? static_cast<size_t>(k) * sizeof(float) : act_row_bytes(f, k);
}

namespace {

// quantize_rows on up to `threads` threads.
void quantize_rows_on(ThreadPool& pool, int threads, Isa isa, GgmlType type, const float* x, int64_t n_tokens,
                      int64_t k, uint8_t* out) {
  const ActFormat fmt = act_format_for(type);
  const size_t row = act_row_bytes_for(type, k);
  if (fmt == ActFormat::kF32) {
    std::copy(x, x + n_tokens * k, reinterpret_cast<float*>(out));
    return;
  }
  const QuantizeActFn quantize = kernel_table(isa).quantize_act[static_cast<size_t>(fmt)];
  KVTIER_ASSERT(quantize != nullptr, "no activation quantiser for {}", ggml_type_name(type));
  const int n_q = static_cast<int>(std::min<int64_t>(threads, n_tokens));
  pool.run(n_q, [&](int part) {
    const Range r = split_range(n_tokens, n_q, part);
    for (int64_t t = r.begin; t < r.end; ++t) quantize(x + t * k, k, out + static_cast<size_t>(t) * row);
  });
}

int64_t weight_row_bytes(const WeightMatrix& w) {
  const auto row_bytes = ggml_row_bytes(w.type, static_cast<uint64_t>(w.k));
  if (!row_bytes) {
    fail(ErrorKind::kInvalidArgument, "inner size {} is not a multiple of the {} block size", w.k,
         ggml_type_name(w.type));
  }
  return static_cast<int64_t>(*row_bytes);
}

}  // namespace

void quantize_rows(ThreadPool& pool, Isa isa, GgmlType type, const float* x, int64_t n_tokens, int64_t k,
                   uint8_t* out) {
  const int threads =
      pool.threads_for(k * n_tokens * static_cast<int64_t>(sizeof(float)), kSleepingPoolMinBytes);
  quantize_rows_on(pool, threads, isa, type, x, n_tokens, k, out);
}

namespace {
void matmul_acts(ThreadPool& pool, Isa isa, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens,
                 float* y, std::span<uint8_t> panel_scratch);
void matmuls_one_run(ThreadPool& pool, Isa isa, std::span<const MatmulOut> outs, const uint8_t* act,
                     int64_t n_tokens);
bool uses_panels(const KernelTable& table, const WeightMatrix& w, int64_t n_tokens);
}  // namespace

void matmul(ThreadPool& pool, Isa isa, const WeightMatrix& w, const float* x, int64_t n_tokens, float* y,
            std::span<uint8_t> scratch) {
  KVTIER_ASSERT(scratch.size() >= matmul_scratch_bytes(w.type, w.k, n_tokens), "matmul scratch of {} bytes",
                scratch.size());
  if (n_tokens == 0 || w.n_rows == 0) return;
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  std::span<uint8_t> panels;
  if (act_format_for(w.type) != ActFormat::kF32) {
    const int threads = pool.threads_for(weight_row_bytes(w) * w.n_rows * n_tokens, kSleepingPoolMinBytes);
    quantize_rows_on(pool, threads, isa, w.type, x, n_tokens, w.k, scratch.data());
    act = scratch.data();
    panels = scratch.subspan(act_row_bytes_for(w.type, w.k) * static_cast<size_t>(n_tokens));
  }
  matmul_acts(pool, isa, w, act, n_tokens, y, panels);
}

void matmul_same_input(ThreadPool& pool, Isa isa, std::span<const MatmulOut> outs, const float* x,
                       int64_t n_tokens, std::span<uint8_t> scratch) {
  KVTIER_ASSERT(!outs.empty(), "matmul_same_input of no matrices");
  const int64_t k = outs.front().w->k;
  const ActFormat fmt = act_format_for(outs.front().w->type);
  bool shared = true;
  for (const MatmulOut& o : outs) {
    KVTIER_ASSERT(o.w->k == k, "matmul_same_input over inner sizes {} and {}", k, o.w->k);
    shared = shared && act_format_for(o.w->type) == fmt;
  }
  if (!shared) {  // the matrices quantise x differently: one matmul each
    for (const MatmulOut& o : outs) matmul(pool, isa, *o.w, x, n_tokens, o.y, scratch);
    return;
  }
  int64_t weight_bytes = 0;
  for (const MatmulOut& o : outs) {
    KVTIER_ASSERT(scratch.size() >= matmul_scratch_bytes(o.w->type, k, n_tokens),
                  "matmul scratch of {} bytes", scratch.size());
    weight_bytes += weight_row_bytes(*o.w) * o.w->n_rows;
  }
  if (n_tokens == 0 || weight_bytes == 0) return;
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  std::span<uint8_t> panels;
  if (fmt != ActFormat::kF32) {
    const int threads = pool.threads_for(weight_bytes * n_tokens, kSleepingPoolMinBytes);
    quantize_rows_on(pool, threads, isa, outs.front().w->type, x, n_tokens, k, scratch.data());
    act = scratch.data();
    panels = scratch.subspan(act_row_bytes_for(outs.front().w->type, k) * static_cast<size_t>(n_tokens));
  }
  const KernelTable& table = kernel_table(isa);
  bool any_panels = false;
  for (const MatmulOut& o : outs) any_panels = any_panels || uses_panels(table, *o.w, n_tokens);
  if (any_panels) {  // prefill: long runs, so one matrix at a time (panels packed per matrix)
    for (const MatmulOut& o : outs) matmul_acts(pool, isa, *o.w, act, n_tokens, o.y, panels);
    return;
  }
  matmuls_one_run(pool, isa, outs, act, n_tokens);
}

void matmul_rows(ThreadPool& pool, Isa isa, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens,
                 float* y) {
  std::vector<uint8_t> panels;  // only for types with panel tiles
  const PanelKernel panel = kernel_table(isa).panel[static_cast<size_t>(w.type)];
  if (panel.fn != nullptr && n_tokens >= kPanelTokens)
    panels.resize(act_panel_bytes(act_format_for(w.type), panel.layout, w.k, n_tokens));
  matmul_acts(pool, isa, w, act, n_tokens, y, panels);
}

namespace {

// One matrix's outputs for the activation rows act ([n_tokens, act_bytes] in its format) without
// panels: rows split in kRowAlign units; within a unit, 32-token tiles; within those, register tiles
// (wide.rows x wide.tokens where the type has them, then tile.rows x tile.tokens), and on the edges
// (decode included) narrow tiles of one token, then single vec_dots. Every path gives vec_dot's bits
// (kernels.h TileFn), so the split and the tiling never change a result.
class TileWalk {
 public:
  TileWalk(const KernelTable& table, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens, float* y)
      : w_(w),
        act_(act),
        n_tokens_(n_tokens),
        y_(y),
        row_bytes_(weight_row_bytes(w)),
        act_bytes_(static_cast<int64_t>(act_row_bytes_for(w.type, w.k))),
        dot_(dot_fn(table, w.type)),
        tile_(table.tile[static_cast<size_t>(w.type)]),
        wide_(table.tile_wide[static_cast<size_t>(w.type)]),
        narrow_(table.tile_narrow[static_cast<size_t>(w.type)]) {
    KVTIER_ASSERT(wide_.fn == nullptr ||
                      (tile_.fn != nullptr && wide_.rows == tile_.rows && wide_.tokens % tile_.tokens == 0),
                  "wide tile of {} rows", wide_.rows);
    KVTIER_ASSERT(narrow_.fn == nullptr || narrow_.tokens == 1, "narrow tile of {} tokens", narrow_.tokens);
  }

  int64_t row_bytes() const { return row_bytes_; }

  // Outputs of rows [rb, re) x tokens [tb, te) one token at a time: narrow tiles, then vec_dots.
  void edge(int64_t rb, int64_t re, int64_t tb, int64_t te) const {
    for (int64_t t = tb; t < te; ++t) {
      const uint8_t* at = act_ + t * act_bytes_;
      float* yt = y_ + t * w_.n_rows;
      int64_t r = rb;
      if (narrow_.fn != nullptr) {
        for (; r + narrow_.rows <= re; r += narrow_.rows)
          narrow_.fn(w_.data + r * row_bytes_, row_bytes_, at, act_bytes_, w_.k, yt + r, w_.n_rows);
      }
      for (; r < re; ++r) yt[r] = dot_(w_.data + r * row_bytes_, at, w_.k);
    }
  }

  // Every token's outputs of the rows in `rows`.
  void rows(Range rows) const {
    for (int64_t r0 = rows.begin; r0 < rows.end; r0 += kRowAlign) {
      const int64_t r1 = std::min(rows.end, r0 + kRowAlign);
      for (int64_t t0 = 0; t0 < n_tokens_; t0 += kTokenTile) {
        const int64_t t1 = std::min(n_tokens_, t0 + kTokenTile);
        if (tile_.fn == nullptr) {
          edge(r0, r1, t0, t1);
          continue;
        }
        // Rows [r0, r_end) x tokens [t0, t_end) in register tiles (wide ones first), the rest
        // one token at a time.
        const int64_t r_end = r0 + (r1 - r0) / tile_.rows * tile_.rows;
        const int64_t t_end = t0 + (t1 - t0) / tile_.tokens * tile_.tokens;
        for (int64_t r = r0; r < r_end; r += tile_.rows) {
          const uint8_t* wr = w_.data + r * row_bytes_;
          int64_t t = t0;
          if (wide_.fn != nullptr) {
            for (; t + wide_.tokens <= t_end; t += wide_.tokens)
              wide_.fn(wr, row_bytes_, act_ + t * act_bytes_, act_bytes_, w_.k, y_ + t * w_.n_rows + r,
                       w_.n_rows);
          }
          for (; t < t_end; t += tile_.tokens)
            tile_.fn(wr, row_bytes_, act_ + t * act_bytes_, act_bytes_, w_.k, y_ + t * w_.n_rows + r,
                     w_.n_rows);
        }
        edge(r0, r1, t_end, t1);
        edge(r_end, r1, t0, t_end);
      }
    }
  }

 private:
  const WeightMatrix& w_;
  const uint8_t* act_;  // [n_tokens, act_bytes_]
  int64_t n_tokens_;
  float* y_;  // [n_tokens, w.n_rows]
  int64_t row_bytes_;
  int64_t act_bytes_;
  VecDotFn dot_;
  TileKernel tile_, wide_, narrow_;
};

bool uses_panels(const KernelTable& table, const WeightMatrix& w, int64_t n_tokens) {
  const auto i = static_cast<size_t>(w.type);
  if (w.lanes != nullptr && table.lanes[i] != nullptr && table.lanes_any_tokens[i]) return false;
  return table.panel[i].fn != nullptr && n_tokens >= kPanelTokens;
}

// The table's lanes kernel for w, where w carries the rows-in-lanes layout, the table has one, and
// the product does not take the panel tiles (where the table has panel or AMX tiles for the type and
// its lanes kernel does not serve many tokens, prefill reads the GGUF rows; lanes_any_tokens).
LanesFn lanes_fn(const KernelTable& table, const WeightMatrix& w, int64_t n_tokens) {
  if (w.lanes == nullptr || uses_panels(table, w, n_tokens)) return nullptr;
  return table.lanes[static_cast<size_t>(w.type)];
}

// Every token's outputs of rows [rows.begin, rows.end) (rows.begin a multiple of kLaneRows) from the
// rows-in-lanes layout, one group of kLaneRows rows at a time.
void lanes_rows(LanesFn fn, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens, float* y,
                Range rows) {
  static_assert(kRowAlign % kLaneRows == 0, "parts must split at lane groups");
  const int64_t group_bytes = lanes_group_bytes(w.type, w.k);
  const auto act_bytes = static_cast<int64_t>(act_row_bytes_for(w.type, w.k));
  // Prefill: tiles of kLanesTokenTile tokens outer, so that a tile's activation rows stay in L2
  // while the part's groups pass over them.
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kLanesTokenTile) {
    const int64_t nt = std::min(kLanesTokenTile, n_tokens - t0);
    for (int64_t r = rows.begin; r < rows.end; r += kLaneRows) {
      const int n = static_cast<int>(std::min<int64_t>(kLaneRows, rows.end - r));
      fn(w.lanes + r / kLaneRows * group_bytes, act + t0 * act_bytes, act_bytes, nt, w.k,
         y + t0 * w.n_rows + r, w.n_rows, n);
    }
  }
}

// Several matrices over the same activation rows in one pool run: part p computes its split_range
// share of every matrix's rows (so each matrix is balanced over the parts as if alone).
void matmuls_one_run(ThreadPool& pool, Isa isa, std::span<const MatmulOut> outs, const uint8_t* act,
                     int64_t n_tokens) {
  const KernelTable& table = kernel_table(isa);
  int64_t bytes = 0, units = 0;
  for (const MatmulOut& o : outs) {
    bytes += weight_row_bytes(*o.w) * o.w->n_rows;
    units = std::max(units, (o.w->n_rows + kRowAlign - 1) / kRowAlign);
  }
  const int threads = pool.threads_for(bytes * n_tokens, kSleepingPoolMinBytes);
  const int n_parts = static_cast<int>(std::min<int64_t>(threads, units));
  if (n_parts == 0) return;
  // Each part sets up its own walks (a few table loads): no allocation per call on the decode path.
  pool.run(n_parts, [&](int part) {
    for (const MatmulOut& o : outs) {
      const Range rows = split_range(o.w->n_rows, n_parts, part, kRowAlign);
      if (const LanesFn lanes = lanes_fn(table, *o.w, n_tokens); lanes != nullptr) {
        lanes_rows(lanes, *o.w, act, n_tokens, o.y, rows);
      } else {
        TileWalk(table, *o.w, act, n_tokens, o.y).rows(rows);
      }
    }
  });
}

void matmul_acts(ThreadPool& pool, Isa isa, const WeightMatrix& w, const uint8_t* act, int64_t n_tokens,
                 float* y, std::span<uint8_t> panel_scratch) {
  if (n_tokens == 0 || w.n_rows == 0) return;
  const KernelTable& table = kernel_table(isa);
  if (!uses_panels(table, w, n_tokens)) {
    const MatmulOut out{&w, y};
    matmuls_one_run(pool, isa, {&out, 1}, act, n_tokens);
    return;
  }
  // Whole groups of kPanelTokens tokens go through panels (packed once, shared by every row), the
  // remaining tokens and rows one token at a time.
  const TileWalk walk(table, w, act, n_tokens, y);
  const PanelKernel panel = table.panel[static_cast<size_t>(w.type)];
  KVTIER_ASSERT(panel.groups >= 1, "panel tile of {} token groups", panel.groups);
  const int64_t row_bytes = walk.row_bytes();
  const int threads = pool.threads_for(row_bytes * w.n_rows * n_tokens, kSleepingPoolMinBytes);
  const int n_parts = static_cast<int>(std::min<int64_t>(threads, (w.n_rows + kRowAlign - 1) / kRowAlign));
  const auto act_bytes = static_cast<int64_t>(act_row_bytes_for(w.type, w.k));
  const int64_t n_groups = n_tokens / kPanelTokens;
  const ActFormat fmt = act_format_for(w.type);
  const bool in_place = panel.layout == PanelLayout::kRows;  // the tile reads the rows themselves
  const size_t group_bytes = in_place ? static_cast<size_t>(kPanelTokens * act_bytes)
                                      : act_panel_bytes(fmt, panel.layout, w.k, kPanelTokens);
  const uint8_t* panels = act;
  if (!in_place) {
    KVTIER_ASSERT(panel_scratch.size() >= group_bytes * static_cast<size_t>(n_groups),
                  "panel scratch of {} bytes", panel_scratch.size());
    uint8_t* packed = panel_scratch.data();
    const int n_pack = static_cast<int>(std::min<int64_t>(threads, n_groups));
    pool.run(n_pack, [&](int part) {
      const Range g = split_range(n_groups, n_pack, part);
      for (int64_t i = g.begin; i < g.end; ++i)
        pack_act_panel(fmt, panel.layout, act + i * kPanelTokens * act_bytes, act_bytes, w.k,
                       packed + i * group_bytes);
    });
    panels = packed;
  }
  const int64_t t_end = n_groups * kPanelTokens;
  pool.run(n_parts, [&](int part) {
    const Range rows = split_range(w.n_rows, n_parts, part, kRowAlign);
    const int64_t r_end = rows.begin + (rows.end - rows.begin) / panel.rows * panel.rows;
    // Row blocks of kRowAlign rows outer, token groups inner: a row block's weights stay in L1/L2
    // while every group passes over them.
    for (int64_t r0 = rows.begin; r0 < r_end; r0 += kRowAlign) {
      const int64_t r1 = std::min(r_end, r0 + kRowAlign);
      for (int64_t g = 0; g < n_groups; g += panel.groups) {
        const int ng = static_cast<int>(std::min<int64_t>(panel.groups, n_groups - g));
        for (int64_t r = r0; r < r1; r += panel.rows)
          panel.fn(w.data + r * row_bytes, row_bytes, panels + g * group_bytes,
                   static_cast<int64_t>(group_bytes), ng, w.k, y + g * kPanelTokens * w.n_rows + r, w.n_rows);
      }
    }
    walk.edge(r_end, rows.end, 0, t_end);
    walk.edge(rows.begin, rows.end, t_end, n_tokens);
  });
}

}  // namespace

}  // namespace kvtier::cpu
