// The memory ledger: bytes held per (tier, category), current and peak, with optional budgets per
// tier enforced at reservation time. One ledger per engine (no global state); not thread-safe:
// reservations happen at set-up and from the engine's driving thread.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace kvtier::kv {

enum class Tier : uint8_t {
  kDevice,  // compute-local memory (GPU HBM, or the RAM budget of the CPU backend)
  kHost,    // host DRAM used as an offload tier
  kDisk,    // files
};
constexpr int kNumTiers = 3;

enum class Category : uint8_t {
  kWeights,
  kKv,           // KV blocks, staging buffers of offloaded KV, static heads, home-tier copies
  kActivations,  // the forward pass's activation buffers (f32, and quantised for the matmuls)
  kStaging,      // new KV rows converted to the KV dtype, waiting to be scattered / written back
  kScratch,      // attention scratch
  kLogits,       // the session's logits buffer
};
constexpr int kNumCategories = 6;

std::string_view tier_name(Tier t);
std::string_view category_name(Category c);

class MemoryLedger {
 public:
  // 0 means no budget. Reserving past a budget throws Error(kBudget) naming tier, category, sizes.
  void set_budget(Tier t, uint64_t bytes) { budget_[idx(t)] = bytes; }
  uint64_t budget(Tier t) const { return budget_[idx(t)]; }

  void reserve(Tier t, Category c, uint64_t bytes);
  void release(Tier t, Category c, uint64_t bytes);

  uint64_t current(Tier t, Category c) const { return cur_[idx(t)][idx(c)]; }
  uint64_t peak(Tier t, Category c) const { return peak_[idx(t)][idx(c)]; }
  uint64_t current(Tier t) const { return tier_cur_[idx(t)]; }
  uint64_t peak(Tier t) const { return tier_peak_[idx(t)]; }

 private:
  template <typename E>
  static size_t idx(E e) {
    return static_cast<size_t>(e);
  }
  std::array<std::array<uint64_t, kNumCategories>, kNumTiers> cur_{};
  std::array<std::array<uint64_t, kNumCategories>, kNumTiers> peak_{};
  std::array<uint64_t, kNumTiers> tier_cur_{};
  std::array<uint64_t, kNumTiers> tier_peak_{};
  std::array<uint64_t, kNumTiers> budget_{};
};

// RAII reservation of bytes in a ledger (movable).
class Reservation {
 public:
  Reservation() = default;
  Reservation(MemoryLedger& ledger, Tier t, Category c, uint64_t bytes);
  ~Reservation();
  Reservation(Reservation&& o) noexcept;
  Reservation& operator=(Reservation&& o) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

 private:
  MemoryLedger* ledger_ = nullptr;
  Tier tier_ = Tier::kDevice;
  Category cat_ = Category::kScratch;
  uint64_t bytes_ = 0;
};

}  // namespace kvtier::kv
