// The InfiniGen sidecar file: a model's skewing matrices per layer and KV head (RoPE form, spec §4.4:
// applied after RoPE, never folded into the weights), their singular values and the offline partial
// column sets (the fallback when a prompt is too short to choose columns, §15.2), tied to the model by
// its file hash (model_hash.h). A GGUF file:
//
//   metadata  infinigen.version (u32) = 1, infinigen.model_hash (string), infinigen.n_layer (u32),
//             infinigen.head_dim (u32), infinigen.partial_ratio (f32), infinigen.partial_columns (u32),
//             infinigen.sample_tokens (u32), infinigen.sample_source (string)
//   tensors   blk.<l>.skew_a      F32  ne [d, d, n_head_kv]   A[h][i][j] at (j, i, h)
//             blk.<l>.skew_sigma  F32  ne [d, n_head_kv]      singular values, descending
//             blk.<l>.skew_cols   I32  ne [k_cols, n_head_kv] ascending column indices
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvtier::skew {

struct LayerSkew {
  uint32_t n_head_kv = 0;
  std::vector<float> a;       // [n_head_kv, d, d] f32 (each head's A row-major, skew_math.h)
  std::vector<float> sigma;   // [n_head_kv, d] f32
  std::vector<int32_t> cols;  // [n_head_kv, k_cols] ascending, distinct, < d

  const float* head_a(uint32_t h, int64_t d) const { return a.data() + static_cast<size_t>(h) * d * d; }
  const int32_t* head_cols(uint32_t h, int64_t k_cols) const {
    return cols.data() + static_cast<size_t>(h) * k_cols;
  }
};

struct SkewSet {
  std::string model_hash;        // model_hash.h form
  uint32_t head_dim = 0;         // d
  float partial_ratio = 0.3f;    // r of the offline column sets
  uint32_t partial_columns = 0;  // k_cols = floor(r·d)
  uint32_t sample_tokens = 0;
  std::string sample_source;  // where the sample text came from (a path)
  std::vector<LayerSkew> layers;
};

// Throws Error(kIo) naming the path when the file cannot be written (nothing is left behind).
// progress: (layers written, layers total).
void write_skew(const SkewSet& set, const std::string& path,
                const std::function<void(size_t, size_t)>& progress = {});

// Reads and validates a sidecar: Error(kInvalidFile) naming the path and the problem when it is not a
// skew file, is truncated or corrupt (shapes, column sets, a matrix that is not orthogonal), or was
// made for another model (expected_hash differs: both hashes are named). Empty expected_hash: no check.
SkewSet read_skew(const std::string& path, const std::string& expected_hash);

// The skew of no rotation (A = I, sigma = 1, offline columns 0 .. k_cols - 1, k_cols from
// partial_ratio) for a model with these KV heads per layer: the speculation's cost with no trained skew
// (synthetic models' speed runs on the GPU); its selections are not InfiniGen's.
SkewSet identity_skew(const std::vector<uint32_t>& n_head_kv, uint32_t head_dim, float partial_ratio);

// Largest |A·A^T - I| entry over all heads of a layer (an orthogonality check, 1e-4 on load).
double orthogonality_error(const LayerSkew& layer, int64_t d);

}  // namespace kvtier::skew
