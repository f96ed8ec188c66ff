// Text generation: prefill the prompt, then decode -> sample -> stream until a stop condition
// (end-of-generation token, a stop string, max tokens). Text is streamed in whole UTF-8
// characters, and text that may be the start of a stop string is held back until it is not.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kvtier::runtime {

enum class StopReason { kMaxTokens, kEndOfGeneration, kStopString, kContextFull, kInterrupted };
std::string_view stop_reason_name(StopReason r);

struct GenerateOptions {
  int64_t max_tokens = 128;
  std::vector<std::string> stop;  // stop strings (not included in the text)
  bool ignore_eos = false;
  std::function<bool()> interrupted;  // polled between tokens (may be empty)
  LogitsFn on_logits;                 // if set: called with the logits of every evaluated position
  // if set: called with the output-normed hidden state of every prompt position (on_logits then sees
  // the decode steps only)
  StatesFn on_states;
};

struct GenerateResult {
  std::vector<TokenId> tokens;  // generated ids (including a final end-of-generation token)
  std::string text;             // generated text (up to a stop string)
  StopReason reason = StopReason::kMaxTokens;
  int64_t n_prompt = 0;
  int64_t n_gen = 0;
  int64_t n_decode = 0;  // single-token forward passes
  double prefill_s = 0.0;
  double decode_s = 0.0;  // from the first sampled token to the end
};

using TextFn = std::function<void(std::string_view)>;

// Appends `prompt` to the session (which may hold earlier turns) and generates.
// `history` holds the sequence so far for the penalties; prompt and output are appended to it.
GenerateResult generate(Session& s, Sampler& sampler, std::span<const TokenId> prompt,
                        const GenerateOptions& opt, std::vector<TokenId>& history, const TextFn& on_text = {},
                        const ProgressFn& progress = {});

}  // namespace kvtier::runtime
