#include "locret/model_hash.h"

#include <fmt/format.h>

#include <cstring>

#include "core/mapped_file.h"

namespace kvtier::locret {
namespace {

constexpr uint64_t kP1 = 0x9e3779b185ebca87ull;
constexpr uint64_t kP2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kP3 = 0x165667b19e3779f9ull;

uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64)
}

uint64_t lane(uint64_t acc, uint64_t w) {
  return rotl(acc + w * kP2, 31) * kP1;
}

uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

}  // namespace

uint64_t hash_bytes(std::span<const uint8_t> bytes) {
  const uint8_t* p = bytes.data();
  const size_t n = bytes.size();
  uint64_t a[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int j = 0; j < 4; ++j) a[j] = lane(a[j], load64(p + i + 8 * j));
  }
  uint64_t h = rotl(a[0], 1) + rotl(a[1], 7) + rotl(a[2], 12) + rotl(a[3], 18);
  for (int j = 0; j < 4; ++j) h = (h ^ lane(0, a[j])) * kP1 + kP3;
  h += static_cast<uint64_t>(n);
  for (; i + 8 <= n; i += 8) h = rotl(h ^ lane(0, load64(p + i)), 27) * kP1 + kP3;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kP3), 11) * kP1;
  return avalanche(h);
}

std::string model_fingerprint(const std::string& gguf_path) {
  const MappedFile f(gguf_path);
  return fmt::format("fp64v1:{:016x}", hash_bytes(f.bytes()));
}

}  // namespace kvtier::locret
