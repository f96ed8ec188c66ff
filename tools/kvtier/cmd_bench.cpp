// kvtier bench -m MODEL [--prompt-tokens 512,4096] [--gen 128] [--threads N] [--repeat 3]
//              [--kv-policy resident,layer,headinfer] [placement flags] [--json]
// Prefill and decode speed: for each prompt length, `repeat` rounds in which every policy runs
// (prefill the prompt, then decode `gen` tokens greedily), interleaved so machine noise hits all
// policies alike (after one unrecorded warm-up round); medians are reported, with each policy's ratio to the
// first, its transfer stall time and bytes moved. Prompt ids are a fixed pseudo-random sequence of ordinary
// tokens (speed does not depend on the values).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "cuda_backend.h"
#include "policy/placement.h"
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
  std::string policies = "resident";
  bool json = false;
};

struct PolicyRun {
  policy::KvPolicy policy;
  std::unique_ptr<runtime::Session> session;
  std::vector<double> pre, dec, stall;
  uint64_t loaded = 0, stored = 0;
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
  const auto policies = kv_policy_list(a.engine, a.policies);
  if (a.engine.backend == Backend::kCuda)
    return run_bench_cuda(a.engine, {a.prompt_tokens, a.gen, a.repeat, a.policies, a.json});
  const auto model = runtime::load_model(a.engine.model);
  if (a.repeat < 1) fail(ErrorKind::kInvalidArgument, "--repeat must be at least 1");
  nlohmann::json rows = nlohmann::json::array();
  const int64_t max_p = *std::max_element(a.prompt_tokens.begin(), a.prompt_tokens.end());
  std::vector<PolicyRun> runs;
  for (const policy::KvPolicy& p : policies) {
    const EngineArgs e = engine_for(a.engine, p);
    runs.push_back(
        {p, std::make_unique<runtime::Session>(*model, session_options(e, model->config, max_p + a.gen))});
  }
  runtime::Session& first = *runs.front().session;
  for (int64_t p : a.prompt_tokens) {
    if (p < 1 || p + a.gen > first.n_ctx()) {
      fail(ErrorKind::kInvalidArgument, "prompt of {} tokens + {} generated does not fit the context of {}",
           p, a.gen, first.n_ctx());
    }
    const auto prompt = bench_prompt(*model, p);
    for (auto& pr : runs) pr.pre.clear(), pr.dec.clear(), pr.stall.clear();
    for (int r = -1; r < a.repeat; ++r) {  // round -1 warms caches and page tables; it is not recorded
      for (auto& pr : runs) {
        runtime::Session& s = *pr.session;
        s.truncate(0);
        const auto before = s.kv_stats();
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
        throw_if_interrupted();
        if (r < 0) continue;
        pr.pre.push_back(static_cast<double>(p) / tp);
        pr.dec.push_back(static_cast<double>(a.gen) / td);
        if (const auto after = s.kv_stats()) {
          pr.stall.push_back(after->transfer.wait_seconds - before->transfer.wait_seconds);
          pr.loaded = after->transfer.bytes_loaded - before->transfer.bytes_loaded;
          pr.stored = after->transfer.bytes_stored - before->transfer.bytes_stored;
        } else {
          pr.stall.push_back(0);
        }
      }
    }
    const double base_pre = median(runs.front().pre), base_dec = median(runs.front().dec);
    for (const auto& pr : runs) {
      const std::string name = pr.policy.spec();
      nlohmann::json row = {{"policy", name},
                            {"prompt_tokens", p},
                            {"gen", a.gen},
                            {"prefill_tokens_per_s", median(pr.pre)},
                            {"decode_tokens_per_s", median(pr.dec)},
                            {"prefill_ratio_to_first", median(pr.pre) / base_pre},
                            {"decode_ratio_to_first", median(pr.dec) / base_dec},
                            {"stall_s", median(pr.stall)},
                            {"bytes_loaded_per_run", pr.loaded},
                            {"bytes_stored_per_run", pr.stored},
                            {"prefill_runs", pr.pre},
                            {"decode_runs", pr.dec},
                            {"peak_memory_bytes", memory_json(pr.session->ledger())}};
      rows.push_back(row);
      if (!a.json) {
        std::cout << fmt::format(
            "{:<9} prompt {:>6} -> prefill {:8.1f} tok/s ({:.3f}x) | decode {:>4} -> {:7.1f} tok/s ({:.3f}x) "
            "| "
            "stall {:.3f} s | moved {} in, {} out (median of {})\n",
            name, p, median(pr.pre), median(pr.pre) / base_pre, a.gen, median(pr.dec),
            median(pr.dec) / base_dec, median(pr.stall), human_bytes(pr.loaded), human_bytes(pr.stored),
            a.repeat);
      }
    }
  }
  if (a.json) {
    nlohmann::json j = {{"model", a.engine.model},
                        {"threads", session_options(a.engine, model->config, max_p + a.gen).threads},
                        {"chunk", first.chunk()},
                        {"ctx", first.n_ctx()},
                        {"isa", std::string(cpu::isa_name(first.isa()))},
                        {"repeat", a.repeat},
                        {"results", rows}};
    std::cout << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Prefill and decode speed (medians of several runs)");
  add_engine_flags(cmd, a->engine, /*with_policy=*/false);
  cmd->add_option("--kv-policy", a->policies,
                  "KV policies to compare, comma-separated (presets or specs, e.g. resident,layer+sliding); "
                  "ratios are to the first")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "prompt lengths, comma-separated")->delimiter(',');
  cmd->add_option("--gen", a->gen, "tokens to decode after each prompt")->check(CLI::PositiveNumber);
  cmd->add_option("--repeat", a->repeat, "runs per length (the median is reported)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->callback([&run, a] { run = [a] { return run_bench(*a); }; });
}

}  // namespace kvtier::cli
