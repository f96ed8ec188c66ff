// The scalar reference kernels (baseline x86-64 code, callable from any path).
#pragma once

#include <cstdint>

namespace kvtier::cpu::ref {

// Dot products: w [k] of the named type, act [k] in its ActFormat. Integer sums are exact within a
// block; per block the float terms (weight scale * activation scale * integer sum, and the min/offset
// term) are added to one float accumulator in block order.
float dot_f32(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_f16(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_bf16(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q4_0(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q4_1(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q5_0(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q5_1(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q8_0(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q2_k(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q3_k(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q4_k(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q5_k(const uint8_t* w, const uint8_t* act, int64_t k);
float dot_q6_k(const uint8_t* w, const uint8_t* act, int64_t k);

// Activation quantisation (quantize_act.h): x [k] f32 -> k / 32 ActQ8_32 or k / 256 ActQ8_K blocks.
void quantize_q8_32(const float* x, int64_t k, uint8_t* dst);
void quantize_q8_32_min(const float* x, int64_t k, uint8_t* dst);  // ActFormat::kQ8_32Min
void quantize_q8_k(const float* x, int64_t k, uint8_t* dst);

void rms_norm(const float* x, const float* w, float eps, int64_t n, float* y);
void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y);
void silu(const float* x, int64_t n, float* y);
void gelu_tanh(const float* x, int64_t n, float* y);
void relu(const float* x, int64_t n, float* y);
void softmax(const float* x, int64_t n, float* y);
void add(const float* a, const float* b, int64_t n, float* y);
void mul(const float* a, const float* b, int64_t n, float* y);
void rope_rotate(float* x, const float* cos, const float* sin, int64_t n_pairs, bool neox);

}  // namespace kvtier::cpu::ref
