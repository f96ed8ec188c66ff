// Per-ISA kernel tables. Each ISA's translation unit fills a table (starting from the scalar one,
// overriding what it implements); kernel_table(isa) hands out a table only for an ISA the running
// CPU supports, so no caller can reach an instruction the CPU lacks.
#pragma once

#include <array>
#include <cstdint>

#include "backend/cpu/act_panel.h"
#include "backend/cpu/cpu_features.h"
#include "core/ggml_type.h"

namespace kvtier::cpu {

// Dot product of one weight row ([k] of the weight type) with one activation row in the weight
// type's ActFormat (quantize_act.h).
using VecDotFn = float (*)(const uint8_t* w, const uint8_t* act, int64_t k);

// Quantises one f32 activation row x [k] into its ActFormat (quantize_act.h); every ISA's version
// writes the same bytes as the scalar quantize_act_row.
using QuantizeActFn = void (*)(const float* x, int64_t k, uint8_t* dst);

// Float ops, all on contiguous f32 rows of n elements (see float_ops.h for the maths).
struct FloatKernels {
  void (*rms_norm)(const float* x, const float* w, float eps, int64_t n, float* y);
  void (*layer_norm)(const float* x, const float* w, const float* b, float eps, int64_t n, float* y);
  void (*silu)(const float* x, int64_t n, float* y);
  void (*gelu_tanh)(const float* x, int64_t n, float* y);
  void (*relu)(const float* x, int64_t n, float* y);
  void (*softmax)(const float* x, int64_t n, float* y);
  void (*add)(const float* a, const float* b, int64_t n, float* y);
  void (*mul)(const float* a, const float* b, int64_t n, float* y);
  // Rotates pairs (x[i0], x[i1]) by angle with the given cos/sin, for pair p: normal pairing uses
  // (2p, 2p+1), NeoX pairing (p, p + n_pairs).
  void (*rope_rotate)(float* x, const float* cos, const float* sin, int64_t n_pairs, bool neox);
};

// Register-blocked matmul micro-kernel: a full tile of `rows` weight rows x `tokens` activation rows.
//   w:   [rows] weight rows of k elements, row_bytes apart
//   act: [tokens] activation rows in the ActFormat, act_bytes apart
//   y:   y[t * ldy + r] for t < tokens, r < rows
// Each output is bit-identical to the same table's vec_dot of that (row, token): same per-block
// arithmetic, same accumulation order over k. So matmul results never depend on the tiling, on
// n_tokens or on the thread count.
using TileFn = void (*)(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                        float* y, int64_t ldy);

struct TileKernel {
  TileFn fn = nullptr;  // null: matmul calls vec_dot per output
  int rows = 0;
  int tokens = 0;
};

// Tile over activation panels (act_panel.h): `rows` weight rows x `groups` token groups of
// kPanelTokens tokens (1 <= groups <= PanelKernel::groups).
//   w: [rows] weight rows, row_bytes apart
//   panel: [groups] token groups' panel blocks, group_bytes apart (PanelQ8_32 or PanelQ8_K by the
//          type's ActFormat, PanelQ8_32Pairs for kPairs16), or for kRows the groups' activation
//          rows themselves ([groups * kPanelTokens] rows, group_bytes / kPanelTokens apart)
//   y: y[t * ldy + r] for t < groups * kPanelTokens, r < rows
// Bit-identical to the same table's vec_dot of each (row, token), like TileFn.
using PanelTileFn = void (*)(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes,
                             int groups, int64_t k, float* y, int64_t ldy);

// A PanelTileFn from a kernel of exactly G groups (kFull) and one of 1 group (kOne, for the last
// groups of a matmul); both take (w, row_bytes, panel, group_bytes, k, y, ldy).
template <auto kFull, auto kOne, int G>
void panel_in_groups(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes,
                     int groups, int64_t k, float* y, int64_t ldy) {
  if (groups == G) {
    kFull(w, row_bytes, panel, group_bytes, k, y, ldy);
    return;
  }
  for (int g = 0; g < groups; ++g)
    kOne(w, row_bytes, panel + g * group_bytes, group_bytes, k, y + g * kPanelTokens * ldy, ldy);
}

struct PanelKernel {
  PanelTileFn fn = nullptr;  // null: the type has no panel tile
  int rows = 0;
  PanelLayout layout = PanelLayout::kGroups;  // how matmul packs the panels it is given
  int groups = 1;                             // token groups per call at most (weights unpacked once for all)
};

// Kernel over the rows-in-lanes layout (weight_lanes.h): one group of kLaneRows weight rows against
// n_tokens activation rows (the group's weights stay in L1/L2 while the tokens pass over them).
//   w:   one packed group (lanes_group_bytes(type, k) bytes, 64-byte aligned)
//   act: [n_tokens] activation rows in the type's ActFormat, act_bytes apart
//   y:   y[t * ldy + r] for t < n_tokens, r < rows (rows <= kLaneRows: the group's real rows)
// Bit-identical to the same table's vec_dot of each (row, token), like TileFn.
using LanesFn = void (*)(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                         float* y, int64_t ldy, int rows);

constexpr size_t kMaxGgmlTypeId = 40;

struct KernelTable {
  Isa isa = Isa::kScalar;
  std::array<VecDotFn, kMaxGgmlTypeId> vec_dot{};  // indexed by GgmlType id; null: unsupported
  // Indexed by GgmlType id. A filler that overrides a vec_dot must also set (or clear) its tile.
  std::array<TileKernel, kMaxGgmlTypeId> tile{};
  // Optional wider tiles (same rows as `tile`, more tokens; same bits): matmul uses them first.
  std::array<TileKernel, kMaxGgmlTypeId> tile_wide{};
  // Optional one-token tiles (rows x 1; same bits as vec_dot): decode and the token edges of a
  // matmul use them before single vec_dots, so several rows' independent chains overlap and share
  // each activation block's loads.
  std::array<TileKernel, kMaxGgmlTypeId> tile_narrow{};
  // Indexed by GgmlType id: tiles over activation panels (quantised activation formats only). Where
  // set, matmul packs whole groups of kPanelTokens tokens into panels and uses these before `tile`.
  std::array<PanelKernel, kMaxGgmlTypeId> panel{};
  // Indexed by GgmlType id: kernels over the rows-in-lanes layout; matmul uses them for matrices
  // that carry one (WeightMatrix::lanes). Null: the type's GGML rows are used.
  std::array<LanesFn, kMaxGgmlTypeId> lanes{};
  // Indexed by GgmlType id: the lanes kernel also serves products of kPanelTokens tokens or more, so
  // a matrix with a copy skips the panel tiles and its GGUF rows are not read again (q8_0 on both
  // vector paths; every lanes type on the AVX-512 one, whose kernels take several tokens per pass,
  // except those the AMX tiles serve).
  std::array<bool, kMaxGgmlTypeId> lanes_any_tokens{};
  // Indexed by ActFormat (quantize_act.h); null for kF32 (activations used in place).
  std::array<QuantizeActFn, 4> quantize_act{};
  FloatKernels fops{};
};

// Which units a table's matmul tiles may use. kBest: the AVX-512 table takes AMX-INT8 panel tiles for
// q4_0, q4_1, q5_0, q5_1, q4_K and q6_K where cpu_features().amx_int8 (matmul_amx*.cpp); kVector: the vector
// tiles only. Both give every output the same bits (the tests hold them to each other's vec_dot).
enum class MatrixUnits { kBest, kVector };

// Throws Error(kUnsupported) when the CPU lacks `isa`.
const KernelTable& kernel_table(Isa isa, MatrixUnits units = MatrixUnits::kBest);

// The fillers, one per translation unit. Only kernel_table calls them (and only for supported ISAs).
void fill_scalar_kernels(KernelTable& t);
void fill_avx2_kernels(KernelTable& t);
void fill_avx512_kernels(KernelTable& t);
void fill_avx2_float_kernels(FloatKernels& f);
void fill_avx2_tiles(KernelTable& t);           // matmul_avx2.cpp (calls fill_avx2_ktiles, _panel)
void fill_avx2_panel_kernels(KernelTable& t);   // matmul_avx2_panel.cpp (vec_dot and tiles)
void fill_avx2_ktiles(KernelTable& t);          // matmul_avx2_kquants.cpp
void fill_avx512_tiles(KernelTable& t);         // matmul_avx512.cpp (calls fill_avx512_ktiles)
void fill_avx512_ktiles(KernelTable& t);        // matmul_avx512_kquants.cpp
void fill_avx2_lanes(KernelTable& t);           // matmul_lanes_avx2.cpp
void fill_avx512_lanes(KernelTable& t);         // matmul_lanes_avx512.cpp
void fill_amx_tiles(KernelTable& t);            // matmul_amx.cpp (AVX-512 table, AMX-INT8 CPUs only)
void fill_amx_ktiles(KernelTable& t);           // matmul_amx_kquants.cpp (the same, q4_K and q6_K)
void fill_avx2_quantize_act(KernelTable& t);    // quantize_act_avx2.cpp
void fill_avx512_quantize_act(KernelTable& t);  // quantize_act_avx512.cpp

}  // namespace kvtier::cpu
