// Reference (scalar) quantisation of f32 rows into GGML block formats, following GGML's
// round-to-nearest reference quantisers. Used to write weight files (synthetic models) and as the
// scalar reference that faster kernels are tested against.
#pragma once

#include <cstdint>
#include <span>

#include "core/ggml_type.h"

namespace kvtier {

// True for the types quantize_row_ref can produce.
bool can_quantize_ref(GgmlType type);

// Writes src ([n] f32, n a multiple of the type's block size) as `type` into dst
// ([n / block_size * type_size] bytes).
void quantize_row_ref(GgmlType type, std::span<const float> src, std::span<uint8_t> dst);

}  // namespace kvtier
