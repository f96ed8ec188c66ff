#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "runtime/argmax.h"

namespace kvtier::runtime {

void check_sampler_params(const SamplerParams& p) {
  // Written so that NaN fails each check. (temperature <= 0 is greedy and top_k <= 0 off, as in
  // llama.cpp; NaN temperature is refused.)
  if (std::isnan(p.temperature)) fail(ErrorKind::kInvalidArgument, "--temp is not a number");
  if (std::isnan(p.presence_penalty) || std::isnan(p.frequency_penalty))
    fail(ErrorKind::kInvalidArgument, "--presence-penalty and --frequency-penalty must be numbers");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    fail(ErrorKind::kInvalidArgument, "--top-p must be in (0, 1] (got {})", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    fail(ErrorKind::kInvalidArgument, "--min-p must be in [0, 1] (got {})", p.min_p);
  if (!(p.repeat_penalty > 0.0f))
    fail(ErrorKind::kInvalidArgument, "--repeat-penalty must be positive (got {})", p.repeat_penalty);
  if (p.penalty_last_n < -1)
    fail(ErrorKind::kInvalidArgument, "--repeat-last-n must be -1 (all), 0 (none) or more (got {})",
         p.penalty_last_n);
}

Sampler::Sampler(const SamplerParams& p, uint32_t n_vocab)
    : p_(p), work_(n_vocab), cand_(n_vocab), counts_(n_vocab, 0), rng_(p.seed) {
  check_sampler_params(p);
  touched_.reserve(n_vocab);
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

TokenId Sampler::sample(std::span<const float> logits, std::span<const TokenId> history) {
  const auto V = static_cast<int64_t>(work_.size());
  KVTIER_ASSERT(static_cast<int64_t>(logits.size()) == V, "{} logits for {} tokens", logits.size(), V);
  // Penalties over the last penalty_last_n tokens of the history.
  const bool penalise =
      (p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) &&
      p_.penalty_last_n != 0;
  if (p_.temperature <= 0.0f && !penalise) {  // greedy on the logits as given: no copy
    return static_cast<TokenId>(first_max_index(logits));
  }
  std::copy(logits.begin(), logits.end(), work_.begin());

  if (penalise) {
    const size_t n = p_.penalty_last_n < 0 ? history.size()
                                           : std::min(history.size(), static_cast<size_t>(p_.penalty_last_n));
    for (TokenId id : history.last(n)) {
      if (id < 0 || id >= V) continue;
      if (counts_[static_cast<size_t>(id)]++ == 0) touched_.push_back(id);
    }
    for (TokenId id : touched_) {
      float& l = work_[static_cast<size_t>(id)];
      const auto c = static_cast<float>(counts_[static_cast<size_t>(id)]);
      l = l > 0.0f ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      l -= c * p_.frequency_penalty + p_.presence_penalty;
      counts_[static_cast<size_t>(id)] = 0;
    }
    touched_.clear();
  }

  if (p_.temperature <= 0.0f) {  // greedy: the first maximum
    return static_cast<TokenId>(first_max_index(work_));
  }

  size_t n = static_cast<size_t>(V);
  for (size_t i = 0; i < n; ++i) cand_[i] = {work_[i], static_cast<TokenId>(i)};
  auto by_logit = [](const Cand& a, const Cand& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  // Top-k first (cheap with nth_element), then sort what is left.
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::nth_element(cand_.begin(), cand_.begin() + p_.top_k - 1, cand_.begin() + static_cast<int64_t>(n),
                     by_logit);
    n = static_cast<size_t>(p_.top_k);
  }
  const float max_logit =
      std::min_element(cand_.begin(), cand_.begin() + static_cast<int64_t>(n), by_logit)->logit;
  // min-p before sorting: p_i >= min_p * p_max  <=>  logit_i >= max + log(min_p) (at temperature 1).
  if (p_.min_p > 0.0f) {
    const float cut = max_logit + std::log(p_.min_p);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      if (cand_[i].logit >= cut) cand_[kept++] = cand_[i];
    }
    n = std::max<size_t>(kept, 1);
  }
  std::sort(cand_.begin(), cand_.begin() + static_cast<int64_t>(n), by_logit);
  // Top-p on the softmax at temperature 1 (llama.cpp's order: top-k, top-p, min-p, temperature).
  if (p_.top_p < 1.0f) {
    double z = 0.0;
    for (size_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(cand_[i].logit - max_logit));
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += std::exp(static_cast<double>(cand_[i].logit - max_logit)) / z;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  // Temperature, softmax, draw.
  double z = 0.0;
  for (size_t i = 0; i < n; ++i)
    z += std::exp(static_cast<double>((cand_[i].logit - max_logit) / p_.temperature));
  const double u = uniform() * z;
  double cum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    cum += std::exp(static_cast<double>((cand_[i].logit - max_logit) / p_.temperature));
    if (u < cum) return cand_[i].id;
  }
  return cand_[n - 1].id;
}

}  // namespace kvtier::runtime
