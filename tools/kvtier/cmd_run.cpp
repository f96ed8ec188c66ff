// kvtier run -m MODEL (-p TEXT | -f FILE | --ids 1,2,3) [-n N] [--chat] [--ctx N] [--chunk N] [--threads N]
//            [--temp --top-k --top-p --min-p --seed ...] [--stop S]... [--json] [--dump-logits FILE]
//            [--logits-digest | --state-digest]
// Streams the generated text to stdout; --json prints one object at the end instead.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "core/content_hash.h"
#include "core/error.h"
#include "cuda_backend.h"
#include "npy_writer.h"
#include "run_common.h"
#include "runtime/generate.h"
#include "token_ids.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/utf8.h"

namespace kvtier::cli {
namespace {

struct RunArgs {
  EngineArgs engine;
  SampleArgs sample;
  std::string prompt;
  std::string file;
  std::string ids;  // comma-separated token ids: the prompt as given, no tokenizer
  int64_t n_predict = 128;
  bool chat = false;
  std::string system;
  std::string chat_template;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool json = false;
  std::string dump_logits;
  bool logits_digest = false;
  bool state_digest = false;
};

// The prompt's token ids: raw text, or a one-turn conversation in the model's chat template.
std::vector<runtime::TokenId> prompt_tokens(const tokenizer::Tokenizer& tok, const std::string& text,
                                            bool chat, const std::string& system,
                                            const std::string& tmpl_name) {
  if (!chat) return tok.encode(text);
  const auto& v = tok.vocab();
  const auto tmpl = tokenizer::chat_template_for(
      v, tmpl_name.empty() ? std::nullopt : std::optional<std::string_view>(tmpl_name));
  std::vector<tokenizer::ChatMessage> msgs;
  if (!system.empty()) msgs.push_back({"system", system});
  msgs.push_back({"user", text});
  const std::string bos = v.special.bos != tokenizer::kNoToken ? v.text[v.special.bos] : "";
  const std::string eos = v.special.eos != tokenizer::kNoToken ? v.text[v.special.eos] : "";
  const std::string formatted = tokenizer::format_chat(tmpl, msgs, true, bos, eos);
  return tok.encode(formatted, {.add_special = !tokenizer::template_writes_bos(tmpl), .parse_special = true});
}

// XXH3-64 of one position's logits or state, as 16 hex digits: equal digests mean equal bits (up to
// hash collisions, 2^-64 per pair).
std::string row_digest(std::span<const float> row) {
  return fmt::format("{:016x}", xxh3_64(row));
}

int run_run(const RunArgs& a) {
  const int n_sources = static_cast<int>(!a.prompt.empty()) + static_cast<int>(!a.file.empty()) +
                        static_cast<int>(!a.ids.empty());
  if (n_sources != 1)
    fail(ErrorKind::kInvalidArgument, "give exactly one of -p TEXT, -f FILE and --ids 1,2,3");
  if (!a.ids.empty() && a.chat)
    fail(ErrorKind::kInvalidArgument, "--ids is the whole prompt: no --chat with it");
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  const auto prompt =
      !a.ids.empty() ? parse_token_ids(*model->tokenizer, a.ids)
                     : prompt_tokens(*model->tokenizer, a.file.empty() ? a.prompt : read_text_file(a.file),
                                     a.chat, a.system, a.chat_template);
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt has no tokens");
  if (a.state_digest && a.engine.backend == Backend::kCuda)
    fail(ErrorKind::kInvalidArgument, "--state-digest runs on the CPU backend only");
  if (a.engine.backend == Backend::kCuda) {
    return run_generate_cuda(a.engine, *model, prompt, sampler_params(a.sample),
                             {a.n_predict, a.ignore_eos, a.json});
  }
  const auto opts =
      session_options(a.engine, model->config, static_cast<int64_t>(prompt.size()) + a.n_predict);
  runtime::Session session(*model, opts);
  const runtime::SamplerParams sp = sampler_params(a.sample);
  runtime::Sampler sampler(sp, model->config.n_vocab);

  std::unique_ptr<NpyWriter> dump;
  runtime::GenerateOptions g;
  g.max_tokens = a.n_predict;
  g.stop = a.stop;
  g.ignore_eos = a.ignore_eos;
  g.interrupted = [] { return interrupted(); };
  if (a.logits_digest && !a.json)
    fail(ErrorKind::kInvalidArgument, "--logits-digest is printed in --json: give both");
  if (a.state_digest && !a.json)
    fail(ErrorKind::kInvalidArgument, "--state-digest is printed in --json: give both");
  if (a.state_digest && (a.logits_digest || !a.dump_logits.empty()))
    fail(ErrorKind::kInvalidArgument,
         "--state-digest replaces the prompt's logits: not with --logits-digest or "
         "--dump-logits");
  if (!a.dump_logits.empty()) dump = std::make_unique<NpyWriter>(a.dump_logits, model->config.n_vocab);
  std::vector<std::string> digests;  // [n_positions] XXH3-64 of each position's logits, hex
  if (dump || a.logits_digest) {
    g.on_logits = [&](int64_t, std::span<const float> row) {
      if (dump) dump->append(row);
      if (a.logits_digest) digests.push_back(row_digest(row));
    };
  }
  std::vector<std::string> states;  // [n_prompt] XXH3-64 of each prompt position's output-normed state, hex
  if (a.state_digest) {
    g.on_states = [&](int64_t, std::span<const float> row) { states.push_back(row_digest(row)); };
    g.on_logits = [&](int64_t, std::span<const float> row) { digests.push_back(row_digest(row)); };
  }
  ProgressBar bar("prefill", stderr_is_tty() && static_cast<int64_t>(prompt.size()) > session.chunk());
  std::vector<runtime::TokenId> history;
  const auto on_text = [&](std::string_view s) {
    if (a.json) return;
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  const runtime::GenerateResult r = runtime::generate(session, sampler, prompt, g, history, on_text,
                                                      [&](int64_t d, int64_t t) { bar.update(d, t); });
  bar.finish();
  if (dump) dump->close();

  const double prefill_tps = r.prefill_s > 0 ? static_cast<double>(r.n_prompt) / r.prefill_s : 0.0;
  const double decode_tps =
      r.decode_s > 0 && r.n_decode > 0 ? static_cast<double>(r.n_decode) / r.decode_s : 0.0;
  if (a.json) {
    nlohmann::json j = {
        {"text", tokenizer::utf8_sanitize(r.text)},
        {"tokens", r.tokens},
        {"prompt_tokens", prompt},
        {"n_prompt", r.n_prompt},
        {"n_gen", r.n_gen},
        {"stop_reason", std::string(runtime::stop_reason_name(r.reason))},
        {"prefill_s", r.prefill_s},
        {"decode_s", r.decode_s},
        {"prefill_tokens_per_s", prefill_tps},
        {"decode_tokens_per_s", decode_tps},
        {"seed", sp.seed},
        {"ctx", session.n_ctx()},
        {"chunk", session.chunk()},
        {"threads", opts.threads},
        {"isa", std::string(cpu::isa_name(session.isa()))},
        {"amx", cpu::uses_amx(session.isa())},
        {"output_lanes", model::output_in_lanes(model->weights, session.isa())},
        {"peak_memory_bytes", memory_json(session.ledger())},
        {"kv", kv_json(session, a.engine)},
        {"weights", weights_json(session)},
    };
    if (a.logits_digest || a.state_digest) j["logits_digest"] = digests;
    if (a.state_digest) j["state_digest"] = states;
    std::cout << j.dump() << "\n";
  }
  if (const auto st = session.kv_stats(); st && st->infinigen.pool_prefill_evictions > 0) {
    // spec infinigen.md §15.13: evicting at prefill is an extension of the paper's pool (a warning)
    std::fprintf(stderr,
                 "warning: the prompt (%lld tokens) is longer than the KV pool's %lld slots per (layer, KV "
                 "head): its prefill evicted %llu rows with the pool's eviction policy\n",
                 static_cast<long long>(r.n_prompt), static_cast<long long>(st->infinigen.pool_slots),
                 static_cast<unsigned long long>(st->infinigen.pool_prefill_evictions));
  }
  if (!a.json) {
    std::fputc('\n', stdout);
    std::fprintf(stderr, "[%lld prompt tokens: %.1f tok/s | %lld generated: %.1f tok/s | %s]\n",
                 static_cast<long long>(r.n_prompt), prefill_tps, static_cast<long long>(r.n_gen), decode_tps,
                 std::string(runtime::stop_reason_name(r.reason)).c_str());
  }
  return 0;
}

}  // namespace

void add_run(CLI::App& app, Runner& run) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate text from a prompt (streams to stdout)");
  add_engine_flags(cmd, a->engine);
  add_sample_flags(cmd, a->sample, runtime::SamplerParams{});
  cmd->add_option("-p,--prompt", a->prompt, "prompt text");
  cmd->add_option("-f,--file", a->file, "read the prompt from a file");
  cmd->add_option("--ids", a->ids, "the prompt as token ids, comma-separated (e.g. 1,2,3; not tokenized)");
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate at most")->check(non_negative());
  cmd->add_flag("--chat", a->chat, "wrap the prompt as a user turn in the model's chat template");
  cmd->add_option("--system", a->system, "system message (with --chat)");
  cmd->add_option("--chat-template", a->chat_template, "chat template name (default: the model's)");
  cmd->add_option("--stop", a->stop, "stop string (repeatable; not included in the output)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating after an end-of-generation token");
  cmd->add_flag("--json", a->json, "print one JSON object at the end (text, ids, speeds, peak memory)");
  cmd->add_option("--dump-logits", a->dump_logits,
                  "write the logits of every evaluated position to a .npy file [n_positions, n_vocab]");
  cmd->add_flag("--logits-digest", a->logits_digest,
                "with --json: a 64-bit hash (XXH3) of the logits' bytes at every evaluated position, in "
                "\"logits_digest\" (bit-identity checks without writing the logits)");
  cmd->add_flag("--state-digest", a->state_digest,
                "with --json: the XXH3 of the output-normed hidden state (the output projection's input) at "
                "every prompt position in \"state_digest\", and of the logits of each decode step in "
                "\"logits_digest\": every position checked bit for bit at the cost of a prefill");
  cmd->callback([&run, a] { run = [a] { return run_run(*a); }; });
}

}  // namespace kvtier::cli
