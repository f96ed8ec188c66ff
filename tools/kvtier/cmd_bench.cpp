// kvtier bench -m MODEL [--prompt-tokens 512,4096] [--gen 128] [--batch 1,4,16] [--threads N] [--repeat 3]
//              [--kv-policy resident,layer,headinfer] [placement flags] [--json [--logits-digest]]
// Prefill and decode speed: for each prompt length and batch size, `repeat` rounds in which every
// policy runs (prefill B prompts, then decode `gen` tokens of each greedily, all B in one pass per
// step), interleaved so machine noise hits all policies alike (after one unrecorded warm-up round);
// medians are reported: aggregate tokens/s (all sequences) and per sequence, each policy's ratio to the
// first, its transfer stall time and bytes moved. Prompt ids are fixed pseudo-random sequences of
// ordinary tokens, one per sequence (speed does not depend on the values); --json also lists each
// sequence's prompt and generated ids (tests compare them with `kvtier run --ids`), and with
// --logits-digest the XXH3-64 of each logits row a sequence got (its prompt's last position, then each
// decode step), as `kvtier run --logits-digest` prints them.
#include <fmt/format.h>

#include <xxhash.h>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "cuda_backend.h"
#include "policy/placement.h"
#include "run_common.h"
#include "runtime/argmax.h"
#include "runtime/session.h"

namespace kvtier::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  EngineArgs engine;
  std::vector<int64_t> prompt_tokens{512, 4096};
  int64_t gen = 128;
  std::vector<int64_t> batch{1};
  int repeat = 3;
  int warmup = 1;
  std::string policies = "resident";
  bool json = false;
  bool logits_digest = false;
};

struct PolicyRun {
  policy::KvPolicy policy;
  std::unique_ptr<runtime::Session> session;
  std::vector<double> pre, dec, stall;
  std::vector<double> pre_cpu,
      dec_cpu;  // prefill / decode tokens per CPU second of the process (all threads)
  uint64_t loaded = 0, stored = 0;
  std::vector<std::vector<runtime::TokenId>> generated;  // [batch] greedy ids of the last round
  std::vector<std::vector<std::string>> digests;         // [batch] --logits-digest of the last round
  uint64_t weights_loaded = 0;                           // weight bytes streamed in the last round
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Sequence `b`'s prompt (b = 0 is the prompt of the single-sequence benchmark).
std::vector<runtime::TokenId> bench_prompt(const runtime::LoadedModel& m, int64_t n, int64_t b) {
  const auto& tok = *m.tokenizer;
  std::vector<runtime::TokenId> ids;
  uint64_t x = 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL * static_cast<uint64_t>(b);
  while (static_cast<int64_t>(ids.size()) < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const auto id = static_cast<runtime::TokenId>(x % m.config.n_vocab);
    if (!tok.is_control(id) && !tok.is_end_of_generation(id)) ids.push_back(id);
  }
  return ids;
}

runtime::TokenId argmax(std::span<const float> l) {
  return static_cast<runtime::TokenId>(runtime::first_max_index(l));
}

// Prefills every prompt (sequence b = prompts[b]) in passes of at most chunk() tokens that mix the
// sequences, then decodes `gen` tokens of each, all sequences in one pass per step. Returns
// the prefill and decode times; `out[b]` gets sequence b's greedy ids.
// CPU seconds the process has used (all threads): a throughput figure that other load on a shared
// machine disturbs less than wall time.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct RoundTimes {
  double prefill_s = 0, decode_s = 0, prefill_cpu_s = 0, decode_cpu_s = 0;
};

// XXH3-64 of one logits row, as 16 hex digits (as `kvtier run --logits-digest`).
std::string logits_digest(std::span<const float> row) {
  return fmt::format("{:016x}", XXH3_64bits(row.data(), row.size_bytes()));
}

// digests (non-null): [b] gets the digest of every logits row sequence b got.
RoundTimes run_batch_round(runtime::Session& s, const std::vector<std::vector<runtime::TokenId>>& prompts,
                           int64_t gen, std::vector<std::vector<runtime::TokenId>>& out,
                           std::vector<std::vector<std::string>>* digests) {
  const size_t B = prompts.size();
  const size_t V = s.model().config.n_vocab;
  out.assign(B, {});
  if (digests != nullptr) digests->assign(B, {});
  std::vector<runtime::TokenId> next(B);
  std::vector<size_t> fed(B, 0);
  // Where the policy's result depends on where passes end, each prompt in the pieces the policy plans
  // for it (its prefill alone runs the same passes), so each sequence gets what it gets alone; else
  // each pass filled with the prompts' next tokens.
  const bool planned = s.prefill_cuts_matter();
  std::vector<std::vector<int64_t>> pieces(B);  // [b] token counts of b's prefill passes (planned)
  std::vector<size_t> piece(B, 0);              // [b] the next of them
  for (size_t b = 0; b < B && planned; ++b)
    pieces[b] = s.plan_prefill(static_cast<kv::SeqId>(b), static_cast<int64_t>(prompts[b].size()));
  std::vector<model::SeqTokens> parts;
  std::vector<size_t> who;
  const auto t0 = Clock::now();
  const double c0 = process_cpu_seconds();
  for (size_t done = 0; done < B;) {
    parts.clear();
    who.clear();
    int64_t budget = s.chunk();
    for (size_t b = 0; b < B && budget > 0 && static_cast<int64_t>(parts.size()) < s.max_batch(); ++b) {
      if (fed[b] == prompts[b].size()) continue;
      const size_t m = planned ? static_cast<size_t>(pieces[b][piece[b]])
                               : std::min<size_t>(static_cast<size_t>(budget), prompts[b].size() - fed[b]);
      if (static_cast<int64_t>(m) > budget) continue;  // the next pass (a piece fits an empty pass)
      if (planned) ++piece[b];
      const bool last = fed[b] + m == prompts[b].size();
      parts.push_back({static_cast<kv::SeqId>(b), std::span(prompts[b]).subspan(fed[b], m),
                       last ? model::LogitRows::kLast : model::LogitRows::kNone});
      who.push_back(b);
      fed[b] += m;
      budget -= static_cast<int64_t>(m);
    }
    const auto logits = s.step(parts);
    throw_if_interrupted();  // Ctrl-C stops a long prompt between its passes
    size_t row = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].rows == model::LogitRows::kNone) continue;
      const auto l = logits.subspan(row++ * V, V);
      next[who[i]] = argmax(l);
      if (digests != nullptr) (*digests)[who[i]].push_back(logits_digest(l));
      ++done;
    }
  }
  const double tp = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto t1 = Clock::now();
  const double c1 = process_cpu_seconds();
  const double cp = c1 - c0;
  for (int64_t g = 0; g < gen; ++g) {
    parts.clear();
    for (size_t b = 0; b < B; ++b) {
      out[b].push_back(next[b]);
      parts.push_back({static_cast<kv::SeqId>(b), {&next[b], 1}, model::LogitRows::kLast});
    }
    const auto logits = s.step(parts);
    throw_if_interrupted();
    for (size_t b = 0; b < B; ++b) {
      next[b] = argmax(logits.subspan(b * V, V));
      if (digests != nullptr) (*digests)[b].push_back(logits_digest(logits.subspan(b * V, V)));
    }
  }
  const double td = std::chrono::duration<double>(Clock::now() - t1).count();
  return {tp, td, cp, process_cpu_seconds() - c1};
}

int run_bench(BenchArgs a) {
  const auto policies = kv_policy_list(a.engine, a.policies);
  if (a.logits_digest && !a.json)
    fail(ErrorKind::kInvalidArgument, "--logits-digest is printed in --json: give both");
  if (a.engine.backend == Backend::kCuda && a.batch != std::vector<int64_t>{1})
    fail(ErrorKind::kUnsupported, "--batch with --backend cuda: the CUDA forward pass runs one sequence");
  if (a.engine.backend == Backend::kCuda)
    return run_bench_cuda(a.engine, {a.prompt_tokens, a.gen, a.repeat, a.policies, a.json});
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  if (a.repeat < 1) fail(ErrorKind::kInvalidArgument, "--repeat must be at least 1");
  const int64_t max_b = *std::max_element(a.batch.begin(), a.batch.end());
  for (int64_t b : a.batch) {
    if (b < 1) fail(ErrorKind::kInvalidArgument, "--batch must be at least 1 (got {})", b);
  }
  nlohmann::json rows = nlohmann::json::array();
  const int64_t max_p = *std::max_element(a.prompt_tokens.begin(), a.prompt_tokens.end());
  std::vector<PolicyRun> runs;
  for (const policy::KvPolicy& p : policies) {
    EngineArgs e = engine_for(a.engine, p);
    runtime::SessionOptions o = session_options(e, model->config, max_p + a.gen);
    o.kv_placement.max_seqs = static_cast<uint32_t>(max_b);
    runs.push_back({p, std::make_unique<runtime::Session>(*model, o)});
  }
  runtime::Session& first = *runs.front().session;
  if (max_b > first.max_batch() || max_b > first.chunk()) {
    fail(ErrorKind::kInvalidArgument,
         "--batch {} is more than one pass can carry (at most {} sequences with --chunk {} on this model)",
         max_b, std::min(first.max_batch(), first.chunk()), first.chunk());
  }
  for (int64_t p : a.prompt_tokens) {
    if (p < 1 || p + a.gen > first.n_ctx()) {
      fail(ErrorKind::kInvalidArgument, "prompt of {} tokens + {} generated does not fit the context of {}",
           p, a.gen, first.n_ctx());
    }
    for (int64_t B : a.batch) {
      std::vector<std::vector<runtime::TokenId>> prompts;
      for (int64_t b = 0; b < B; ++b) prompts.push_back(bench_prompt(*model, p, b));
      for (auto& pr : runs)
        pr.pre.clear(), pr.dec.clear(), pr.stall.clear(), pr.pre_cpu.clear(), pr.dec_cpu.clear();
      for (int r = -a.warmup; r < a.repeat; ++r) {  // rounds < 0 warm caches and page tables, unrecorded
        for (auto& pr : runs) {
          runtime::Session& s = *pr.session;
          for (int64_t b = 0; b < max_b; ++b) s.truncate(static_cast<kv::SeqId>(b), 0);
          const auto before = s.kv_stats();
          const uint64_t w_before = s.weight_stats().bytes_loaded;
          const RoundTimes rt =
              run_batch_round(s, prompts, a.gen, pr.generated, a.logits_digest ? &pr.digests : nullptr);
          pr.weights_loaded = s.weight_stats().bytes_loaded - w_before;
          const double tp = rt.prefill_s, td = rt.decode_s;
          throw_if_interrupted();
          if (r < 0) continue;
          pr.pre.push_back(static_cast<double>(p * B) / tp);
          pr.dec.push_back(static_cast<double>(a.gen * B) / td);
          pr.pre_cpu.push_back(static_cast<double>(p * B) / rt.prefill_cpu_s);
          pr.dec_cpu.push_back(static_cast<double>(a.gen * B) / rt.decode_cpu_s);
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
        const auto Bd = static_cast<double>(B);
        nlohmann::json seqs = nlohmann::json::array();
        for (int64_t b = 0; b < B; ++b) {
          seqs.push_back({{"prompt_ids", prompts[static_cast<size_t>(b)]},
                          {"tokens", pr.generated[static_cast<size_t>(b)]}});
          if (a.logits_digest) seqs.back()["logits_digest"] = pr.digests[static_cast<size_t>(b)];
        }
        nlohmann::json row = {{"policy", name},
                              {"prompt_tokens", p},
                              {"gen", a.gen},
                              {"batch", B},
                              {"prefill_tokens_per_s", median(pr.pre)},
                              {"decode_tokens_per_s", median(pr.dec)},
                              {"decode_tokens_per_s_per_seq", median(pr.dec) / Bd},
                              {"prefill_tokens_per_cpu_s", median(pr.pre_cpu)},
                              {"decode_tokens_per_cpu_s", median(pr.dec_cpu)},
                              {"prefill_ratio_to_first", median(pr.pre) / base_pre},
                              {"decode_ratio_to_first", median(pr.dec) / base_dec},
                              {"stall_s", median(pr.stall)},
                              {"bytes_loaded_per_run", pr.loaded},
                              {"bytes_stored_per_run", pr.stored},
                              {"weight_bytes_loaded_per_run", pr.weights_loaded},
                              {"prefill_runs", pr.pre},
                              {"decode_runs", pr.dec},
                              {"peak_memory_bytes", memory_json(pr.session->ledger())}};
        if (a.json) {
          row["sequences"] = seqs;
          row["kv"] = kv_json(*pr.session, engine_for(a.engine, pr.policy));
          row["weights"] = weights_json(*pr.session);
        }
        rows.push_back(row);
        if (!a.json) {
          std::cout << fmt::format(
              "{:<9} prompt {:>6} x{:<3} -> prefill {:8.1f} tok/s ({:.3f}x) | decode {:>4} -> {:7.1f} tok/s "
              "({:.1f}/seq, {:.3f}x; {:.1f} per CPU s) | stall {:.3f} s | moved {} in, {} out (median of "
              "{})\n",
              name, p, B, median(pr.pre), median(pr.pre) / base_pre, a.gen, median(pr.dec),
              median(pr.dec) / Bd, median(pr.dec) / base_dec, median(pr.dec_cpu), median(pr.stall),
              human_bytes(pr.loaded), human_bytes(pr.stored), a.repeat);
        }
      }
    }
  }
  if (a.json) {
    nlohmann::json j = {
        {"model", a.engine.model},
        {"threads",
         session_options(engine_for(a.engine, policies.front()), model->config, max_p + a.gen).threads},
        {"chunk", first.chunk()},
        {"ctx", first.n_ctx()},
        {"isa", std::string(cpu::isa_name(first.isa()))},
        {"amx", cpu::uses_amx(first.isa())},
        {"output_lanes", model::output_in_lanes(model->weights, first.isa())},
        // the layers' rows-in-lanes copies within the device weights (decode reads them instead of
        // the GGUF rows, prefill the GGUF rows)
        {"layer_lanes_bytes", model->weights.lanes_extra_bytes},
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
  cmd->add_option("--gen", a->gen, "tokens to decode after each prompt")->check(positive());
  cmd->add_option("--batch", a->batch,
                  "sequences run together, comma-separated sizes (each pass carries all of them; tok/s are "
                  "aggregate and per sequence)")
      ->delimiter(',');
  cmd->add_option("--repeat", a->repeat, "runs per length (the median is reported)")->check(positive());
  cmd->add_option("--warmup", a->warmup, "unrecorded rounds before the measured ones")
      ->check(non_negative())
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->add_flag("--logits-digest", a->logits_digest,
                "with --json: each sequence's XXH3-64 of every logits row it got (prompt end, decode steps)");
  cmd->callback([&run, a] { run = [a] { return run_bench(*a); }; });
}

}  // namespace kvtier::cli
