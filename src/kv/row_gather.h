// Gathering the rows a selection chose (InfiniGen's prefetch, spec infinigen.md §7.1–7.2, A7): copy
// rows of a [slots, row_bytes] plane at the given slots into a contiguous staging buffer, bytes
// unchanged, and the attention set of a decode step: the chosen rows plus the current token's,
// which is never left out (§15.8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::kv {

// dst[i] = plane[slots[i]] for rows of row_bytes bytes: dst: [slots.size(), row_bytes] bytes.
void gather_rows(const uint8_t* plane, size_t row_bytes, std::span<const int32_t> slots, uint8_t* dst);

// The rows a step attends: `chosen` (ascending, distinct) with `current` added where it is missing,
// ascending. out is reused (no allocation once it has grown).
void attention_rows(std::span<const int32_t> chosen, int32_t current, std::vector<int32_t>& out);

}  // namespace kvtier::kv
