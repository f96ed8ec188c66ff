// kvtier chat -m MODEL [--system TEXT] [--ctx N] [sampling flags]: an interactive REPL in the model's
// chat template. Multi-turn: each turn re-formats the conversation, keeps the cached prefix that
// still matches and prefills only the rest. Ctrl-D (end of input) ends.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "run_common.h"
#include "runtime/generate.h"
#include "tokenizer/chat_template.h"

namespace kvtier::cli {
namespace {

struct ChatArgs {
  EngineArgs engine;
  SampleArgs sample;
  std::string system;
  std::string chat_template;
  int64_t n_predict = 1024;
};

int run_chat(ChatArgs a) {
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  const auto& tok = *model->tokenizer;
  const auto& v = tok.vocab();
  const auto tmpl = tokenizer::chat_template_for(
      v, a.chat_template.empty() ? std::nullopt : std::optional<std::string_view>(a.chat_template));
  const std::string bos = v.special.bos != tokenizer::kNoToken ? v.text[v.special.bos] : "";
  const std::string eos = v.special.eos != tokenizer::kNoToken ? v.text[v.special.eos] : "";
  if (a.engine.ctx == 0)
    a.engine.ctx = std::min<int64_t>(4096, model->config.n_ctx_train ? model->config.n_ctx_train : 4096);
  const auto opts = session_options(a.engine, model->config, a.engine.ctx);
  runtime::Session session(*model, opts);
  runtime::Sampler sampler(sampler_params(a.sample), model->config.n_vocab);
  const bool interactive = isatty(STDIN_FILENO) != 0;

  std::vector<tokenizer::ChatMessage> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  std::vector<runtime::TokenId> cached;  // the tokens whose KV the session holds, in order
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    const std::string text = tokenizer::format_chat(tmpl, msgs, true, bos, eos);
    const auto ids =
        tok.encode(text, {.add_special = !tokenizer::template_writes_bos(tmpl), .parse_special = true});
    // Keep the longest cached prefix that the new prompt repeats (at least one token is evaluated).
    size_t keep = 0;
    while (keep < cached.size() && keep + 1 < ids.size() && cached[keep] == ids[keep]) ++keep;
    session.truncate(static_cast<int64_t>(keep));
    cached.resize(keep);
    const std::span<const runtime::TokenId> fresh(ids.data() + keep, ids.size() - keep);
    if (static_cast<int64_t>(ids.size()) + 1 >= session.n_ctx()) {
      fail(ErrorKind::kBudget, "the conversation ({} tokens) fills the context of {} (raise --ctx)",
           ids.size(), session.n_ctx());
    }
    runtime::GenerateOptions g;
    g.max_tokens = std::min<int64_t>(a.n_predict, session.n_ctx() - static_cast<int64_t>(ids.size()));
    g.interrupted = [] { return interrupted(); };
    std::vector<runtime::TokenId> history(cached);
    const auto r = runtime::generate(session, sampler, fresh, g, history, [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    // The session now holds the prompt and every generated token but the last sampled one.
    cached.assign(history.begin(), history.begin() + session.n_past());
    msgs.push_back({"assistant", r.text});
    if (r.reason == runtime::StopReason::kInterrupted) break;
  }
  return 0;
}

}  // namespace

void add_chat(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive chat in the model's chat template (Ctrl-D ends)");
  add_engine_flags(cmd, a->engine);
  runtime::SamplerParams d;
  d.temperature = 0.7f;
  d.top_k = 40;
  d.top_p = 0.95f;
  d.min_p = 0.05f;
  d.repeat_penalty = 1.1f;
  add_sample_flags(cmd, a->sample, d);
  cmd->add_option("--system", a->system, "system message");
  cmd->add_option("--chat-template", a->chat_template, "chat template name (default: the model's)");
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens per reply at most")->check(positive());
  cmd->callback([&run, a] { run = [a] { return run_chat(*a); }; });
}

}  // namespace kvtier::cli
