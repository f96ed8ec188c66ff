// Kernel entry points shared between attention.cu (the tile kernel and attend()) and
// attention_merge.cu (the ordered merge of split partials). Internal to the CUDA backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/attention.h"

namespace kvtier::cuda::attn {

// Merges the n_chunks partials of every (token, head) row in chunk order and stores o and lse.
// part_o: [n_chunks, n_tokens, n_heads, dv] f32, part_ml: [n_chunks, n_tokens, n_heads, 2] f32.
void launch_split_merge(const float* part_o, const float* part_ml, int64_t n_chunks, int64_t n_tokens,
                        int64_t n_heads, int64_t dv, const AttnOutput& out, cudaStream_t stream);

}  // namespace kvtier::cuda::attn
