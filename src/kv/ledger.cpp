#include "kv/ledger.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace kvtier::kv {

std::string_view tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
  }
  return "?";
}

std::string_view category_name(Category c) {
  switch (c) {
    case Category::kWeights:
      return "weights";
    case Category::kKv:
      return "kv";
    case Category::kActivations:
      return "activations";
    case Category::kStaging:
      return "staging";
    case Category::kScratch:
      return "scratch";
    case Category::kLogits:
      return "logits";
  }
  return "?";
}

void MemoryLedger::reserve(Tier t, Category c, uint64_t bytes) {
  const uint64_t after = tier_cur_[idx(t)] + bytes;
  if (budget_[idx(t)] != 0 && after > budget_[idx(t)]) {
    fail(ErrorKind::kBudget,
         "{} budget of {} bytes exceeded: {} more bytes of {} would make {} (raise the budget, shorten --ctx "
         "or --chunk, or choose an offloading policy)",
         tier_name(t), budget_[idx(t)], bytes, category_name(c), after);
  }
  tier_cur_[idx(t)] = after;
  tier_peak_[idx(t)] = std::max(tier_peak_[idx(t)], after);
  cur_[idx(t)][idx(c)] += bytes;
  peak_[idx(t)][idx(c)] = std::max(peak_[idx(t)][idx(c)], cur_[idx(t)][idx(c)]);
}

void MemoryLedger::release(Tier t, Category c, uint64_t bytes) {
  KVTIER_ASSERT(cur_[idx(t)][idx(c)] >= bytes, "releasing {} bytes of {} {}", bytes, tier_name(t),
                category_name(c));
  cur_[idx(t)][idx(c)] -= bytes;
  tier_cur_[idx(t)] -= bytes;
}

Reservation::Reservation(MemoryLedger& ledger, Tier t, Category c, uint64_t bytes)
    : ledger_(&ledger), tier_(t), cat_(c), bytes_(bytes) {
  ledger.reserve(t, c, bytes);
}

Reservation::~Reservation() {
  if (ledger_ != nullptr) ledger_->release(tier_, cat_, bytes_);
}

Reservation::Reservation(Reservation&& o) noexcept
    : ledger_(std::exchange(o.ledger_, nullptr)), tier_(o.tier_), cat_(o.cat_), bytes_(o.bytes_) {}

Reservation& Reservation::operator=(Reservation&& o) noexcept {
  if (this != &o) {
    if (ledger_ != nullptr) ledger_->release(tier_, cat_, bytes_);
    ledger_ = std::exchange(o.ledger_, nullptr);
    tier_ = o.tier_;
    cat_ = o.cat_;
    bytes_ = o.bytes_;
  }
  return *this;
}

}  // namespace kvtier::kv
