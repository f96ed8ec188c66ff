// Runs tasks over a grid for several KV policies through an Engine (the model behind an
// interface, so the harness is tested without one). Samples are generated once per task and run
// under every policy, so policies are compared on identical prompts.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/results.h"
#include "eval/task.h"

namespace kvtier::eval {

class Engine {
 public:
  virtual ~Engine() = default;
  // Tokens of the prompt as generate() would feed it (chat template included).
  virtual int64_t count_tokens(const Prompt& p) = 0;
  // Plain text to tokens (no special tokens added), for ppl.
  virtual std::vector<int32_t> tokenize(std::string_view text) = 0;
  // Later calls run under this KV policy (one of the names the plan lists).
  virtual void use_policy(const std::string& policy) = 0;
  // Greedy generation of at most `max_new_tokens` after the prompt; the text after the prefix.
  virtual std::string generate(const Prompt& p, int max_new_tokens) = 0;
  // Evaluates `tokens` from an empty context, calling fn(position, logits) for every position.
  virtual void evaluate(std::span<const int32_t> tokens,
                        const std::function<void(int64_t, std::span<const float>)>& fn) = 0;
};

struct EvalPlan {
  std::vector<TaskKind> tasks;
  GridSpec grid;
  std::vector<std::string> policies;
  std::string ppl_text;  // empty: a generated essay long enough for the grid
};

struct Progress {
  int64_t done = 0, total = 0;  // samples (x policies)
  double elapsed_s = 0.0;
  double eta_s = -1.0;  // -1: unknown yet
  std::string current;  // "niah 4096 d=0.50 #0 resident"
};
using ProgressSink = std::function<void(const Progress&)>;

// The text ppl runs on when none is given: essay filler with at least `min_tokens` tokens.
std::string ppl_default_text(Engine& e, uint64_t seed, int64_t min_tokens);
std::string_view ppl_default_source();

Results run_eval(Engine& e, const EvalPlan& plan, const ProgressSink& progress = {});

}  // namespace kvtier::eval
