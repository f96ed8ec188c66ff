#include "runtime/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "runtime/text_stream.h"

namespace kvtier::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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
  std::span<const float> logits = opt.on_states   ? s.evaluate_states(0, prompt, opt.on_states, checked)
                                  : opt.on_logits ? s.evaluate(prompt, opt.on_logits, checked)
                                                  : s.prefill(prompt, checked);
  r.prefill_s = since(t0);

  TextStream text(tok, opt.stop);
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
    const std::string out = text.push(id);
    r.text += out;
    if (on_text && !out.empty()) on_text(out);
    if (text.stopped()) {
      r.reason = StopReason::kStopString;
      break;
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
  const std::string rest = text.finish();
  r.text += rest;
  if (on_text && !rest.empty()) on_text(rest);
  r.decode_s = since(t1);
  return r;
}

}  // namespace kvtier::runtime
