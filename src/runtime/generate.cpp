#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "tokenizer/decoder.h"

namespace kvtier::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t held_suffix(std::string_view text, const std::vector<std::string>& stop) {
  size_t best = 0;
  for (const auto& s : stop) {
    for (size_t n = std::min(text.size(), s.size() - 1); n > best; --n) {
      if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) {
        best = n;
        break;
      }
    }
  }
  return best;
}

}  // namespace

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kEndOfGeneration:
      return "eos";
    case StopReason::kStopString:
      return "stop_string";
    case StopReason::kContextFull:
      return "context_full";
    case StopReason::kInterrupted:
      return "interrupted";
  }
  return "?";
}

GenerateResult generate(Session& s, Sampler& sampler, std::span<const TokenId> prompt,
                        const GenerateOptions& opt, std::vector<TokenId>& history, const TextFn& on_text,
                        const ProgressFn& progress) {
  const tokenizer::Tokenizer& tok = *s.model().tokenizer;
  GenerateResult r;
  r.n_prompt = static_cast<int64_t>(prompt.size());
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  if (s.n_past() + r.n_prompt > s.n_ctx()) {
    fail(ErrorKind::kBudget, "the prompt needs {} positions but the context holds {} (raise --ctx)",
         s.n_past() + r.n_prompt, s.n_ctx());
  }
  history.insert(history.end(), prompt.begin(), prompt.end());
  const auto t0 = Clock::now();
  // A long prefill stops at the next chunk boundary when interruption is requested.
  const ProgressFn checked = [&](int64_t done, int64_t total) {
    if (progress) progress(done, total);
    if (opt.interrupted && opt.interrupted()) fail(ErrorKind::kInterrupted, "interrupted during the prompt");
  };
  std::span<const float> logits =
      opt.on_logits ? s.evaluate(prompt, opt.on_logits, checked) : s.prefill(prompt, checked);
  r.prefill_s = since(t0);

  tokenizer::StreamDecoder dec(tok, {.render_special = false});
  std::string pending;  // decoded but not yet released (may start a stop string)
  std::string_view stop_hit;
  const auto t1 = Clock::now();
  r.reason = StopReason::kMaxTokens;
  while (r.n_gen < opt.max_tokens) {
    if (opt.interrupted && opt.interrupted()) {
      r.reason = StopReason::kInterrupted;
      break;
    }
    const TokenId id = sampler.sample(logits, history);
    r.tokens.push_back(id);
    history.push_back(id);
    ++r.n_gen;
    if (!opt.ignore_eos && tok.is_end_of_generation(id)) {
      r.reason = StopReason::kEndOfGeneration;
      break;
    }
    pending += dec.push(id);
    // Stop strings: cut at the first match; otherwise release all but a possible stop prefix.
    size_t cut = std::string::npos;
    for (const auto& st : opt.stop) {
      const size_t at = pending.find(st);
      if (at != std::string::npos && at < cut) {
        cut = at;
        stop_hit = st;
      }
    }
    if (cut != std::string::npos) {
      pending.resize(cut);
      r.reason = StopReason::kStopString;
      break;
    }
    const size_t hold = held_suffix(pending, opt.stop);
    if (pending.size() > hold) {
      const std::string out = pending.substr(0, pending.size() - hold);
      r.text += out;
      if (on_text) on_text(out);
      pending.erase(0, pending.size() - hold);
    }
    if (r.n_gen >= opt.max_tokens) break;
    if (s.n_past() >= s.n_ctx()) {
      r.reason = StopReason::kContextFull;
      break;
    }
    logits = s.decode(id);
    ++r.n_decode;
    if (opt.on_logits) opt.on_logits(s.n_past() - 1, logits);
  }
  if (r.reason != StopReason::kStopString) pending += dec.flush();
  r.text += pending;
  if (on_text && !pending.empty()) on_text(pending);
  r.decode_s = since(t1);
  return r;
}

}  // namespace kvtier::runtime
