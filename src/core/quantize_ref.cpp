#include "core/quantize_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace kvtier {
namespace {

constexpr int kQK = 32;

void put_u16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

// block_q8_0: { f16 d; int8 qs[32]; }
void quantize_q8_0(const float* x, uint8_t* y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  for (int j = 0; j < kQK; ++j) y[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

// block_q4_0: { f16 d; uint8 qs[16]; } low nibbles hold elements 0..15, high nibbles 16..31.
void quantize_q4_0(const float* x, uint8_t* y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
    y[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

// block_q4_1: { f16 d; f16 m; uint8 qs[16]; }
void quantize_q4_1(const float* x, uint8_t* y) {
  float min = x[0], max = x[0];
  for (int j = 1; j < kQK; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(y, f32_to_f16(d));
  put_u16(y + 2, f32_to_f16(min));
  for (int j = 0; j < kQK / 2; ++j) {
    const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
    const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + kQK / 2] - min) * id + 0.5f)));
    y[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

}  // namespace

bool can_quantize_ref(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
      return true;
    default:
      return false;
  }
}

void quantize_row_ref(GgmlType type, std::span<const float> src, std::span<uint8_t> dst) {
  const auto& t = ggml_traits(type);
  KVTIER_ASSERT(src.size() % t.block_size == 0, "{} row of {} elements", t.name, src.size());
  const size_t n_blocks = src.size() / t.block_size;
  KVTIER_ASSERT(dst.size() == n_blocks * t.type_size, "dst of {} bytes for {} blocks", dst.size(), n_blocks);
  const float* x = src.data();
  uint8_t* y = dst.data();
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(y, x, src.size() * 4);
      return;
    case GgmlType::kF16:
      for (size_t i = 0; i < src.size(); ++i) put_u16(y + 2 * i, f32_to_f16(x[i]));
      return;
    case GgmlType::kBF16:
      for (size_t i = 0; i < src.size(); ++i) put_u16(y + 2 * i, f32_to_bf16(x[i]));
      return;
    case GgmlType::kQ8_0:
      for (size_t b = 0; b < n_blocks; ++b) quantize_q8_0(x + b * kQK, y + b * t.type_size);
      return;
    case GgmlType::kQ4_0:
      for (size_t b = 0; b < n_blocks; ++b) quantize_q4_0(x + b * kQK, y + b * t.type_size);
      return;
    case GgmlType::kQ4_1:
      for (size_t b = 0; b < n_blocks; ++b) quantize_q4_1(x + b * kQK, y + b * t.type_size);
      return;
    default:
      fail(ErrorKind::kUnsupported, "no reference quantiser for type {}", t.name);
  }
}

}  // namespace kvtier
