// Activation panels: the quantised activation rows of kPanelTokens tokens interleaved so that one
// 256-bit vector holds the same 4 elements of every token (lane t: token t). A matmul tile then
// broadcasts 4 weight bytes against one panel vector and gets 8 tokens' partial dots in 8 lanes;
// the per-block float work (convert, scale product, FMA) is done once per 8 tokens instead of once
// per token. A panel is built once per matmul call and shared by every weight row.
//
// A second layout (PanelLayout::kPairs16, q8_0's) widens the quants to int16 and puts the same 2
// elements of every token in one 32-bit lane: one VPMADDWD of a broadcast pair of int16 weights then
// gives 8 tokens' partial dots with no sign trick (both operands signed).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/blocks.h"
#include "backend/cpu/quantize_act.h"

namespace kvtier::cpu {

constexpr int kPanelTokens = 8;

// One block of 32 elements (an ActQ8_32 block) of kPanelTokens tokens.
struct PanelQ8_32 {
  int8_t qs[kQK / 4][kPanelTokens][4];  // [group of 4 elements][token][4]
  float d[kPanelTokens];                // [token] the block's scale
  union {
    int32_t sum[kPanelTokens];  // [token] kQ8_32: the sum of the block's 32 quants
    float dsum[kPanelTokens];   // [token] kQ8_32Min: d * f32(that sum)
  };
};
static_assert(sizeof(PanelQ8_32) == 320);

// Which arrangement of a panel's quants a panel tile reads (kernels.h PanelKernel::layout).
enum class PanelLayout {
  kGroups,   // PanelQ8_32 / PanelQ8_K: 4-element groups of all tokens side by side
  kPairs16,  // PanelQ8_32Pairs: 2-element int16 pairs of all tokens side by side (kQ8_32 only)
  kRows,     // none: the tile reads the quantised activation rows in place, a group being kPanelTokens
             // consecutive rows (group_bytes = kPanelTokens x the row's bytes; AMX tiles load them so)
};

// One block of 32 elements of kPanelTokens tokens, the quants widened to int16.
struct PanelQ8_32Pairs {
  int16_t qs[kQK / 2][kPanelTokens][2];  // [pair of elements][token][2]
  float d[kPanelTokens];                 // [token] the block's scale
  int32_t sum[kPanelTokens];             // [token] the sum of the block's 32 quants
};
static_assert(sizeof(PanelQ8_32Pairs) == 576);

// One super-block of 256 elements (an ActQ8_K block) of kPanelTokens tokens.
struct PanelQ8_K {
  int8_t qs[kQKK / 4][kPanelTokens][4];       // [group of 4 elements][token][4]
  float d[kPanelTokens];                      // [token] the super-block's scale
  int16_t bsums[kQKK / 32][kPanelTokens][2];  // [32-element sub-block j][token][its two 16-sums]
};
static_assert(sizeof(PanelQ8_K) == 2048 + 32 + 256);

// Whether `format` has panels (kQ8_32 and kQ8_K do, kF32 not).
bool has_act_panels(ActFormat format);

// Bytes of the panels in `layout` for n_tokens tokens of k elements (only whole groups of kPanelTokens
// tokens are panelled; k a multiple of the format's block size). kRows: 0, nothing is packed.
size_t act_panel_bytes(ActFormat format, PanelLayout layout, int64_t k, int64_t n_tokens);
// The most act_panel_bytes takes for any layout of the format (scratch sized before the ISA is known).
size_t act_panel_bytes_max(ActFormat format, int64_t k, int64_t n_tokens);

// act: [kPanelTokens] activation rows of `format` of k elements, act_bytes apart -> panel: one
// panel block (PanelQ8_32 / PanelQ8_K, or PanelQ8_32Pairs for kPairs16) per activation block.
// Not for kRows (nothing to pack).
void pack_act_panel(ActFormat format, PanelLayout layout, const uint8_t* act, int64_t act_bytes, int64_t k,
                    uint8_t* panel);

}  // namespace kvtier::cpu
