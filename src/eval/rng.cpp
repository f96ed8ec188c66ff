#include "eval/rng.h"

#include "core/error.h"

namespace kvtier::eval {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

}  // namespace

uint64_t mix_seed(uint64_t seed, std::initializer_list<uint64_t> coords) {
  uint64_t x = seed;
  uint64_t h = splitmix64(x);
  for (uint64_t c : coords) {
    x = h ^ (c + 0x632BE59BD9B4E019ull);
    h = splitmix64(x);
  }
  return h;
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  KVTIER_ASSERT(n > 0, "Rng::below(0)");
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // reject the biased tail
  uint64_t x = next();
  while (x >= limit) x = next();
  return x % n;
}

int64_t Rng::between(int64_t lo, int64_t hi) {
  KVTIER_ASSERT(lo <= hi, "Rng::between({}, {})", lo, hi);
  return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
}

double Rng::unit() {
  return static_cast<double>(next() >> 11) * 0x1.0p-53;
}

std::string random_number(Rng& rng, int digits) {
  KVTIER_ASSERT(digits > 0 && digits < 19, "digits {}", digits);
  std::string s(1, static_cast<char>('1' + rng.below(9)));
  for (int i = 1; i < digits; ++i) s += static_cast<char>('0' + rng.below(10));
  return s;
}

}  // namespace kvtier::eval
