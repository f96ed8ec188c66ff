// GGUF files for tests: one that uses every metadata value type (nested and empty arrays, edge
// values) and a few tensors of different types.
#pragma once

#include "gguf/writer.h"

namespace kvtier::gguf::testing {

Writer all_types_writer(uint32_t alignment = 32);

}  // namespace kvtier::gguf::testing
