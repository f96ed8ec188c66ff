// Prefill passes over the rows-in-lanes layout on AVX-512 (matmul_lanes_avx512_tokens.cpp): one
// group of kLaneRows rows against several tokens at a time (6 or 8, by type), so each weight vector
// is loaded and unpacked once for all of them. Each returns how many of the n_tokens leading tokens
// it computed (whole passes); the caller's one-token kernel does the rest. Arguments as LanesFn
// (kernels.h); every output has the bits of the AVX-512 table's vec_dot.
#pragma once

#include <cstdint>

namespace kvtier::cpu::lanes_avx512 {

constexpr int kLanesPassTokens = 8;  // the most tokens of one pass; products of fewer skip the passes

int64_t q8_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q4_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q4_1_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q5_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q5_1_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q4_k_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);
int64_t q6_k_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows);

}  // namespace kvtier::cpu::lanes_avx512
