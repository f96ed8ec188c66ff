// kvtier bench -m MODEL [--prompt-tokens 512,4096] [--gen 128] [--threads N] [--repeat 3] [--json]
// Prefill and decode speed: for each prompt length, `repeat` runs of (prefill the prompt, then
// decode `gen` tokens greedily); medians are reported. Prompt ids are a fixed pseudo-random
// sequence of ordinary tokens (speed does not depend on the values).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "run_common.h"
#include "runtime/session.h"

namespace kvtier::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  EngineArgs engine;
  std::vector<int64_t> prompt_tokens{512, 4096};
  int64_t gen = 128;
  int repeat = 3;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<runtime::TokenId> bench_prompt(const runtime::LoadedModel& m, int64_t n) {
  const auto& tok = *m.tokenizer;
  std::vector<runtime::TokenId> ids;
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  while (static_cast<int64_t>(ids.size()) < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const auto id = static_cast<runtime::TokenId>(x % m.config.n_vocab);
    if (!tok.is_control(id) && !tok.is_end_of_generation(id)) ids.push_back(id);
  }
  return ids;
}

int run_bench(BenchArgs a) {
  const auto model = runtime::load_model(a.engine.model);
  if (a.repeat < 1) fail(ErrorKind::kInvalidArgument, "--repeat must be at least 1");
  nlohmann::json rows = nlohmann::json::array();
  const int64_t max_p = *std::max_element(a.prompt_tokens.begin(), a.prompt_tokens.end());
  const auto opts = session_options(a.engine, model->config, max_p + a.gen);
  runtime::Session s(*model, opts);
  for (int64_t p : a.prompt_tokens) {
    if (p < 1 || p + a.gen > s.n_ctx())
      fail(ErrorKind::kInvalidArgument, "prompt of {} tokens + {} generated", p, a.gen);
    const auto prompt = bench_prompt(*model, p);
    std::vector<double> pre, dec;
    for (int r = 0; r < a.repeat; ++r) {
      s.truncate(0);
      const auto t0 = Clock::now();
      auto logits = s.prefill(prompt);
      const double tp = std::chrono::duration<double>(Clock::now() - t0).count();
      const auto t1 = Clock::now();
      for (int64_t g = 0; g < a.gen; ++g) {
        const auto id =
            static_cast<runtime::TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = s.decode(id);
      }
      const double td = std::chrono::duration<double>(Clock::now() - t1).count();
      pre.push_back(static_cast<double>(p) / tp);
      dec.push_back(static_cast<double>(a.gen) / td);
      throw_if_interrupted();
    }
    nlohmann::json row = {{"prompt_tokens", p},
                          {"gen", a.gen},
                          {"prefill_tokens_per_s", median(pre)},
                          {"decode_tokens_per_s", median(dec)},
                          {"prefill_runs", pre},
                          {"decode_runs", dec}};
    rows.push_back(row);
    if (!a.json) {
      std::cout << fmt::format(
          "{}: prompt {:>5} -> prefill {:8.1f} tok/s | decode {:>4} -> {:7.1f} tok/s (median of {})\n",
          a.engine.model, p, median(pre), a.gen, median(dec), a.repeat);
    }
  }
  if (a.json) {
    nlohmann::json j = {{"model", a.engine.model},
                        {"threads", opts.threads},
                        {"chunk", s.chunk()},
                        {"isa", std::string(cpu::isa_name(s.isa()))},
                        {"repeat", a.repeat},
                        {"results", rows},
                        {"peak_memory_bytes", memory_json(s.ledger())}};
    std::cout << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed (medians of several runs)");
  add_engine_flags(cmd, a->engine);
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prompt lengths, comma-separated")->delimiter(',');
  cmd->add_option("--gen", a->gen, "tokens to decode after each prompt")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", a->repeat, "runs per length (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([&run, a] { run = [a] { return run_bench(*a); }; });
}

}  // namespace kvtier::cli
