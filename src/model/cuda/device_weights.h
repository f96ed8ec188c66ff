// The model's weights on the device: every matrix dequantised on the host and stored as bf16
// (backend/cuda/weight_upload.h), norm weights, biases and RoPE factors as f32. Each tensor is
// carved from the context's arena and counted in the ledger (device tier, weights).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/context.h"
#include "kv/ledger.h"
#include "model/config.h"
#include "model/weights.h"

namespace kvtier::model_cuda {

struct DeviceMatrix {
  const uint16_t* w = nullptr;  // [n_rows, k] bf16 bits (device)
  int64_t n_rows = 0;
  int64_t k = 0;
};

struct DeviceLayerWeights {
  const float* attn_norm = nullptr;       // [n_embd] f32
  const float* attn_q_norm = nullptr;     // [head_dim_k] f32 (Gemma-3)
  const float* attn_k_norm = nullptr;     // [head_dim_k] f32 (Gemma-3)
  const float* post_attn_norm = nullptr;  // [n_embd] f32 (Gemma-3)
  const float* ffn_norm = nullptr;        // [n_embd] f32
  const float* post_ffn_norm = nullptr;   // [n_embd] f32 (Gemma-3)
  DeviceMatrix wq;                        // [n_head * head_dim_k, n_embd]
  DeviceMatrix wk;                        // [n_head_kv * head_dim_k, n_embd]
  DeviceMatrix wv;                        // [n_head_kv * head_dim_v, n_embd]
  DeviceMatrix wo;                        // [n_embd, n_head * head_dim_v]
  const float* bq = nullptr;              // [n_head * head_dim_k] f32 (Qwen2)
  const float* bk = nullptr;              // [n_head_kv * head_dim_k] f32
  const float* bv = nullptr;              // [n_head_kv * head_dim_v] f32
  DeviceMatrix gate;                      // [n_ff, n_embd]
  DeviceMatrix up;                        // [n_ff, n_embd]
  DeviceMatrix down;                      // [n_embd, n_ff]
};

struct DeviceWeights {
  DeviceMatrix tok_embd;               // [n_vocab, n_embd]
  const float* output_norm = nullptr;  // [n_embd] f32
  DeviceMatrix output;                 // [n_vocab, n_embd] (tok_embd when tied)
  const float* rope_freqs = nullptr;   // [n_rot / 2] f32 (optional)
  std::vector<DeviceLayerWeights> layers;
  uint64_t bytes = 0;  // device bytes of all tensors
  kv::Reservation reservation;
};

// Device bytes upload_weights will take (for sizing --device-mem and error messages).
uint64_t device_weight_bytes(const model::ModelConfig& cfg, const model::ModelWeights& w);

// Uploads every tensor (blocking: load time). Error(kBudget) names the arena when they do not fit.
DeviceWeights upload_weights(cuda::Context& ctx, const model::ModelConfig& cfg, const model::ModelWeights& w,
                             kv::MemoryLedger& ledger);

// Pinned bytes the upload borrows (and returns) for its staging pieces.
constexpr size_t kUploadStagingBytes = size_t{16} << 20;

}  // namespace kvtier::model_cuda
