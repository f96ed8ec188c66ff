#include "backend/cuda/weight_upload.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/dequant.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pinned_pool.h"
#include "core/half.h"

namespace kvtier::cuda {

void dequantize_to_bf16(GgmlType type, const uint8_t* src, int64_t n_rows, int64_t row_len,
                        std::span<float> tmp, uint16_t* dst) {
  const GgmlTypeTraits& tr = ggml_traits(type);
  if (!cpu::is_supported_weight_type(type)) {
    fail(ErrorKind::kUnsupported, "weight type {} cannot be dequantised for the CUDA backend", tr.name);
  }
  KVTIER_ASSERT(row_len % tr.block_size == 0 && tmp.size() >= static_cast<size_t>(row_len),
                "row of {} for {}", row_len, tr.name);
  const size_t row_bytes = static_cast<size_t>(row_len / tr.block_size) * tr.type_size;
  for (int64_t r = 0; r < n_rows; ++r) {
    cpu::dequantize_row(type, src + static_cast<size_t>(r) * row_bytes, tmp.data(), row_len);
    uint16_t* out = dst + r * row_len;
    for (int64_t i = 0; i < row_len; ++i) out[i] = f32_to_bf16(tmp[static_cast<size_t>(i)]);
  }
}

void upload_weight_bf16(GgmlType type, const uint8_t* src, int64_t n_rows, int64_t row_len, uint16_t* dst,
                        PinnedHostPool& pool, size_t staging_bytes, cudaStream_t stream) {
  const GgmlTypeTraits& tr = ggml_traits(type);
  const size_t row_out = static_cast<size_t>(row_len) * sizeof(uint16_t);
  const size_t row_bytes = static_cast<size_t>(row_len / tr.block_size) * tr.type_size;
  const int64_t rows_per_piece = std::max<int64_t>(1, static_cast<int64_t>(staging_bytes / row_out));
  const size_t mark = pool.mark();
  auto* staging = pool.allocate<uint16_t>(static_cast<size_t>(rows_per_piece) * static_cast<size_t>(row_len),
                                          "weight upload staging");
  std::vector<float> tmp(static_cast<size_t>(row_len));
  try {
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_piece) {
      const int64_t n = std::min(rows_per_piece, n_rows - r0);
      // The previous piece's copy must be done before the staging buffer is overwritten.
      KVTIER_CUDA_CHECK(cudaStreamSynchronize(stream));
      dequantize_to_bf16(type, src + static_cast<size_t>(r0) * row_bytes, n, row_len, tmp, staging);
      KVTIER_CUDA_CHECK(cudaMemcpyAsync(dst + r0 * row_len, staging, static_cast<size_t>(n) * row_out,
                                        cudaMemcpyHostToDevice, stream));
    }
    KVTIER_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    pool.rewind(mark);
    throw;
  }
  pool.rewind(mark);
}

}  // namespace kvtier::cuda
