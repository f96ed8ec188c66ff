#include "kv/row_gather.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kvtier::kv {

void gather_rows(const uint8_t* plane, size_t row_bytes, std::span<const int32_t> slots, uint8_t* dst) {
  for (size_t i = 0; i < slots.size(); ++i) {
    KVTIER_ASSERT(slots[i] >= 0, "slot {}", slots[i]);
    std::memcpy(dst + i * row_bytes, plane + static_cast<size_t>(slots[i]) * row_bytes, row_bytes);
  }
}

void attention_rows(std::span<const int32_t> chosen, int32_t current, std::vector<int32_t>& out) {
  out.assign(chosen.begin(), chosen.end());
  const auto at = std::lower_bound(out.begin(), out.end(), current);
  if (at == out.end() || *at != current) out.insert(at, current);
}

}  // namespace kvtier::kv
