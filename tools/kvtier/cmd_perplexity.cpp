// kvtier perplexity -m MODEL -f TEXT [--ctx N] [--chunks N] [--json] [--infinigen-emulate[-from N]]
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "run_common.h"
#include "runtime/perplexity.h"

namespace kvtier::cli {
namespace {

struct PerplexityArgs {
  EngineArgs engine;
  std::string file;
  int64_t max_windows = 0;
  bool json = false;
  bool emulate = false;
  int64_t emulate_from = 0;
};

int run_perplexity(PerplexityArgs a) {
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  const std::string text = read_text_file(a.file);
  const auto tokens = model->tokenizer->encode(text);
  if (a.engine.ctx == 0) a.engine.ctx = 512;  // llama.cpp's default window
  auto opts = session_options(a.engine, model->config, a.engine.ctx);
  opts.infinigen_emulation = a.emulate || a.emulate_from > 0;
  opts.infinigen_emulate_from = a.emulate_from;
  runtime::Session session(*model, opts);
  ProgressBar bar("perplexity", stderr_is_tty());
  const auto r = runtime::perplexity(session, tokens, a.engine.ctx, a.max_windows, [&](int64_t d, int64_t t) {
    throw_if_interrupted();  // Ctrl-C stops between windows
    bar.update(d, t);
  });
  bar.finish();
  const double tps = static_cast<double>(r.n_windows * a.engine.ctx) / r.seconds;
  if (a.json) {
    nlohmann::json j = {{"perplexity", r.perplexity}, {"nll", r.nll},
                        {"n_tokens", tokens.size()},  {"n_windows", r.n_windows},
                        {"ctx", a.engine.ctx},        {"n_scored", r.n_scored},
                        {"window_ppl", r.window_ppl}, {"seconds", r.seconds},
                        {"tokens_per_s", tps},        {"chunk", session.chunk()},
                        {"threads", opts.threads},    {"peak_memory_bytes", memory_json(session.ledger())}};
    if (const auto e = session.emulation_stats()) {
      j["infinigen_emulation"] = {
          {"emulate_from", opts.infinigen_emulate_from},
          {"queries", e->queries},
          {"rows_total", e->rows_total},
          {"rows_chosen", e->rows_chosen},
          {"fetched_fraction",
           e->rows_total > 0 ? static_cast<double>(e->rows_chosen) / e->rows_total : 0.0}};
    }
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format(
        "perplexity {:.4f} ({} windows of {} tokens, {} scored; {} tokens in the text; {:.1f} tok/s)\n",
        r.perplexity, r.n_windows, a.engine.ctx, r.n_scored, tokens.size(), tps);
  }
  return 0;
}

}  // namespace

void add_perplexity(CLI::App& app, Runner& run) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a model on a text (llama.cpp's method)");
  add_engine_flags(cmd, a->engine);
  cmd->add_option("-f,--file", a->file, "text file")->required();
  cmd->add_option("--chunks", a->max_windows, "score at most this many windows (0: all)")
      ->check(non_negative());
  cmd->add_flag("--json", a->json, "print one JSON object");
  cmd->add_flag(
      "--infinigen-emulate", a->emulate,
      "with a +infinigen policy: InfiniGen's teacher-forced emulation (the paper's accuracy method): "
      "every query of each window attends only the rows the decode path would speculate for it "
      "(skew file's offline columns), in ordinary passes over a resident cache; the perplexity "
      "of --chunk 1 decode steps at a fraction of the time");
  cmd->add_option(
         "--infinigen-emulate-from", a->emulate_from,
         "the emulation (implies --infinigen-emulate) from this position of each window on: the tokens "
         "before it attend densely as a prompt, and the speculation's columns are chosen from them, "
         "per window, as the decode path chooses them from its prompt (64 tokens or more; below that "
         "the skew file's offline set); --ctx/2 emulates exactly the scored half; 0: every token, "
         "offline columns")
      ->check(non_negative());
  cmd->callback([&run, a] { run = [a] { return run_perplexity(*a); }; });
}

}  // namespace kvtier::cli
