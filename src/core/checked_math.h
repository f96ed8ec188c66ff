// Overflow-checked size arithmetic for validating untrusted sizes (file headers, user budgets).
#pragma once

#include <cstdint>
#include <optional>

namespace kvtier {

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Rounds v up to a multiple of align (a power of two); nullopt on overflow.
inline std::optional<uint64_t> checked_align_up(uint64_t v, uint64_t align) {
  auto s = checked_add(v, align - 1);
  if (!s) return std::nullopt;
  return *s & ~(align - 1);
}

}  // namespace kvtier
