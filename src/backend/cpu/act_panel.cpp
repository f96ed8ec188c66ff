#include "backend/cpu/act_panel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kvtier::cpu {

bool has_act_panels(ActFormat format) {
  return format == ActFormat::kQ8_32 || format == ActFormat::kQ8_32Min || format == ActFormat::kQ8_K;
}

size_t act_panel_bytes(ActFormat format, PanelLayout layout, int64_t k, int64_t n_tokens) {
  const auto groups = static_cast<size_t>(n_tokens / kPanelTokens);
  if (layout == PanelLayout::kRows) return 0;
  switch (format) {
    case ActFormat::kQ8_32:
    case ActFormat::kQ8_32Min:
      return groups * static_cast<size_t>(k / kQK) *
             (layout == PanelLayout::kPairs16 ? sizeof(PanelQ8_32Pairs) : sizeof(PanelQ8_32));
    case ActFormat::kQ8_K:
      return groups * static_cast<size_t>(k / kQKK) * sizeof(PanelQ8_K);
    case ActFormat::kF32:
      break;
  }
  return 0;
}

size_t act_panel_bytes_max(ActFormat format, int64_t k, int64_t n_tokens) {
  return std::max(
      act_panel_bytes(format, PanelLayout::kGroups, k, n_tokens),
      format == ActFormat::kQ8_32 ? act_panel_bytes(format, PanelLayout::kPairs16, k, n_tokens) : 0);
}

void pack_act_panel(ActFormat format, PanelLayout layout, const uint8_t* act, int64_t act_bytes, int64_t k,
                    uint8_t* panel) {
  KVTIER_ASSERT(has_act_panels(format), "no panels for f32 activations");
  KVTIER_ASSERT(layout != PanelLayout::kRows, "row layout: the rows are used in place, not packed");
  KVTIER_ASSERT(layout == PanelLayout::kGroups || format == ActFormat::kQ8_32,
                "int16 pair panels are for q8_32 only");
  for (int t = 0; t < kPanelTokens; ++t) {
    const uint8_t* row = act + t * act_bytes;
    if (layout == PanelLayout::kPairs16) {
      const auto* a = reinterpret_cast<const ActQ8_32*>(row);
      auto* out = reinterpret_cast<PanelQ8_32Pairs*>(panel);
      for (int64_t b = 0; b < k / kQK; ++b) {
        for (int j = 0; j < kQK / 2; ++j) {
          out[b].qs[j][t][0] = a[b].qs[2 * j];
          out[b].qs[j][t][1] = a[b].qs[2 * j + 1];
        }
        out[b].d[t] = a[b].d;
        out[b].sum[t] = a[b].sum;
      }
    } else if (format == ActFormat::kQ8_32 || format == ActFormat::kQ8_32Min) {
      const auto* a = reinterpret_cast<const ActQ8_32*>(row);
      auto* out = reinterpret_cast<PanelQ8_32*>(panel);
      for (int64_t b = 0; b < k / kQK; ++b) {
        for (int g = 0; g < kQK / 4; ++g) std::memcpy(out[b].qs[g][t], a[b].qs + 4 * g, 4);
        out[b].d[t] = a[b].d;
        if (format == ActFormat::kQ8_32Min)
          out[b].dsum[t] = a[b].dsum;
        else
          out[b].sum[t] = a[b].sum;
      }
    } else {
      const auto* a = reinterpret_cast<const ActQ8_K*>(row);
      auto* out = reinterpret_cast<PanelQ8_K*>(panel);
      for (int64_t b = 0; b < k / kQKK; ++b) {
        for (int g = 0; g < kQKK / 4; ++g) std::memcpy(out[b].qs[g][t], a[b].qs + 4 * g, 4);
        out[b].d[t] = a[b].d;
        for (int j = 0; j < kQKK / 32; ++j) {
          out[b].bsums[j][t][0] = a[b].bsums[2 * j];
          out[b].bsums[j][t][1] = a[b].bsums[2 * j + 1];
        }
      }
    }
  }
}

}  // namespace kvtier::cpu
