// kvtier compare TASK[,TASK...] -m MODEL --results FILE [--kv-policy all|P1,P2,...]
//                [--budgets 1/2,1/4,1/8,1/16] [--lengths 2k,4k] [--depths 0.5] [--samples N] [--seed S]
//                [--report DIR] [engine flags]
// The policy comparison sweep: every cell of policies x budgets x lengths x tasks runs the eval
// harness in a KV cache of the cell's length (a fresh session per cell, so its memory ledger
// measures that cell), and its line (samples, KV bytes per tier, bytes moved, prefill and decode
// time) is appended to the results file as soon as it finishes; a later run with the same file
// continues where the last one stopped.
// kvtier compare-report FILE... --report DIR: the report from results files, without a model.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "eval/sweep_report.h"
#include "eval/sweep_run.h"
#include "eval_common.h"
#include "kv/footprint.h"
#include "run_common.h"
#include "runtime/generate.h"
#include "runtime/skew_sample.h"

namespace kvtier::cli {
namespace {

struct CompareArgs {
  EngineArgs engine;
  std::string tasks;
  std::string policies = "all";
  std::string budgets = "1/2,1/4,1/8,1/16";
  std::string lengths = "2k,4k";
  std::string depths = "0.5";
  int samples = 1;
  uint64_t seed = 0;
  std::string results;
  std::string report;
  std::string text;
  std::string chat_template;
  bool no_chat = false;
  bool list = false;
  std::string command;
};

// The model behind the sweep: one session per cell, sized to the cell's length, with the cell's
// policy and --kv-budget; generation timed for the speed columns.
class CompareEngine final : public eval::SweepEngine {
 public:
  CompareEngine(const runtime::LoadedModel& m, EngineArgs args, std::optional<tokenizer::ChatTemplate> t)
      : model_(m), args_(std::move(args)), tmpl_(t) {}

  void configure(const eval::CellKey& cell) override {
    EngineArgs e = args_;
    e.kv_policy = cell.policy;
    e.knobs.budget = cell.budget_tokens;
    e = engine_for(e, kv_policy_of(e, cell.policy));
    const runtime::SessionOptions o = session_options(e, model_.config, cell.length);
    session_.reset();
    session_ = std::make_unique<runtime::Session>(model_, o);
    config_ = cell.config();
    m_ = {};
    m_.threads = o.threads;
  }
  void use_policy(const std::string& name) override {
    if (name != config_) fail(ErrorKind::kInternal, "compare: cell '{}' runs '{}'", config_, name);
  }
  int64_t count_tokens(const eval::Prompt& p) override {
    return static_cast<int64_t>(eval_prompt_tokens(model_, tmpl_, p).size());
  }
  std::vector<int32_t> tokenize(std::string_view text) override {
    return model_.tokenizer->encode(text, {.add_special = false, .parse_special = false});
  }
  std::string generate(const eval::Prompt& p, int max_new_tokens) override {
    throw_if_interrupted();
    session_->truncate(0);
    const auto prompt = eval_prompt_tokens(model_, tmpl_, p);
    runtime::Sampler sampler(runtime::SamplerParams{}, model_.config.n_vocab);  // greedy
    runtime::GenerateOptions g;
    g.max_tokens = max_new_tokens;
    g.interrupted = [] { return interrupted(); };
    std::vector<runtime::TokenId> history;
    const runtime::GenerateResult r = runtime::generate(*session_, sampler, prompt, g, history);
    m_.prefill_tokens += r.n_prompt;
    m_.prefill_s += r.prefill_s;
    m_.decode_tokens += r.n_decode;
    m_.decode_s += r.decode_s;
    return r.text;
  }
  void evaluate(std::span<const int32_t> tokens,
                const std::function<void(int64_t, std::span<const float>)>& fn) override {
    throw_if_interrupted();
    session_->truncate(0);
    session_->evaluate(tokens, fn);
  }
  eval::CellMeasures measures() const override {
    eval::CellMeasures m = m_;
    const kv::MemoryLedger& l = session_->ledger();
    m.kv = {l.peak(kv::Tier::kDevice, kv::Category::kKv), l.peak(kv::Tier::kHost, kv::Category::kKv),
            l.peak(kv::Tier::kDisk, kv::Category::kKv)};
    if (const auto st = session_->kv_stats()) {
      m.bytes_loaded = st->transfer.bytes_loaded;
      m.bytes_stored = st->transfer.bytes_stored;
    }
    return m;
  }

 private:
  const runtime::LoadedModel& model_;
  EngineArgs args_;
  std::optional<tokenizer::ChatTemplate> tmpl_;
  std::unique_ptr<runtime::Session> session_;
  std::string config_;
  eval::CellMeasures m_;
};

std::string command_line(const CompareArgs& a) {
  std::string c = fmt::format(
      "kvtier compare {} -m {} --kv-policy {} --budgets {} --lengths {} --depths {} "
      "--samples {} --seed {}",
      a.tasks, a.engine.model, a.policies, a.budgets, a.lengths, a.depths, a.samples, a.seed);
  const EngineArgs& e = a.engine;
  if (e.chunk > 0) c += fmt::format(" --chunk {}", e.chunk);
  if (e.threads > 0) c += fmt::format(" -t {}", e.threads);
  if (!e.isa.empty()) c += " --isa " + e.isa;
  if (!e.kv_mem.empty()) c += " --kv-mem " + e.kv_mem;
  if (!e.kv_disk.empty()) c += " --kv-disk " + e.kv_disk;
  if (e.group > 0) c += fmt::format(" --group {}", e.group);
  if (!e.skew.empty()) c += " --skew " + e.skew;
  if (!e.locret_heads.empty()) c += " --locret-heads " + e.locret_heads;
  c += knob_flags_text(e.knobs);  // --kv-budget is not among them: each cell's comes from --budgets
  if (!a.text.empty()) c += " --text " + a.text;
  if (!a.chat_template.empty()) c += " --chat-template " + a.chat_template;
  if (a.no_chat) c += " --no-chat";
  c += " --results " + a.results;
  if (!a.report.empty()) c += " --report " + a.report;
  return c;
}

// Why `spec` cannot run in this sweep, or "" when it can: the placement rules make_kv_cache applies
// (kv::check_placement_options), and the files a policy reads (infinigen's skew file, locret's
// retaining heads). Checked before the model loads, so that a sweep does not stop at such a cell.
std::string why_not(const EngineArgs& a, const std::string& spec) {
  EngineArgs e = a;
  if (e.knobs.budget == 0) e.knobs.budget = 1024;  // nominal: each cell's comes from --budgets
  try {
    const policy::KvPolicy p = kv_policy_of(e, spec);
    const EngineArgs pe = engine_for(e, p);
    kv::TieredOptions o;
    o.placement.placement = p.placement;
    o.placement.group = pe.group;
    o.placement.static_heads = pe.static_heads;
    o.representation = p.representation;
    o.selection = p.selection;
    o.retention = p.retention;
    o.knobs = p.knobs;
    o.disk_dir = pe.kv_disk;
    kv::check_placement_options(o);
    if (p.retention == policy::Retention::kLocret && a.locret_heads.empty())
      return "it needs trained retaining heads: --locret-heads FILE (scripts/train_locret_heads.sh MODEL "
             "DIR)";
    if (p.selection == policy::Selection::kInfinigen) {
      const std::string skew = runtime::infinigen_skew_path(a.model, a.skew);
      if (!std::filesystem::exists(skew))
        return fmt::format(
            "it needs the model's skew file and {} does not exist (kvtier skew -m {} -o {}; "
            "--skew FILE names another)",
            skew, a.model, skew);
    }
  } catch (const Error& err) {
    return err.what();
  }
  return {};
}

void print_summary(const std::vector<eval::CellResult>& cells) {
  std::printf("%-28s %-6s %14s %20s %13s\n", "policy", "budget", "KV vs resident", "accuracy vs resident",
              "same answers");
  for (const eval::ConfigSummary& r : eval::summarize(cells)) {
    std::printf("%-28s %-6s %14.3f %19.1f%% %12.1f%%\n", r.policy.c_str(),
                r.budget ? r.budget->text().c_str() : "-", r.kv_ratio, r.rel_accuracy * 100,
                r.same_answers * 100);
  }
}

int run_compare(const CompareArgs& a) {
  if (!a.engine.kv_type.empty())
    fail(ErrorKind::kInvalidArgument,
         "compare: name the representation in each policy (e.g. resident+f32) instead of --kv-type");
  if (a.engine.knobs.budget != 0)
    fail(ErrorKind::kInvalidArgument,
         "compare: --kv-budget is set per cell from --budgets (fractions of the length)");
  if (a.engine.ctx != 0)
    fail(ErrorKind::kInvalidArgument, "compare: the KV cache is sized to each length; drop --ctx");
  eval::SweepSpec spec;
  spec.tasks = eval::parse_task_list(a.tasks);
  spec.lengths = parse_lengths(a.lengths);
  std::vector<eval::SkippedPolicy> skipped;
  const eval::PolicyCheck check = [&a](const std::string& s) { return why_not(a.engine, s); };
  spec.policies = eval::sweep_policies(a.policies, check, &skipped);
  for (const eval::SkippedPolicy& s : skipped)
    std::fprintf(stderr, "kvtier compare: --kv-policy all leaves out %s: %s\n", s.spec.c_str(),
                 s.reason.c_str());
  for (const eval::SweepPolicy& p : spec.policies) {  // the ones named in the list, checked the same way
    if (const std::string why = check(p.spec); !why.empty())
      fail(ErrorKind::kInvalidArgument, "compare: --kv-policy {} cannot run: {}", p.spec, why);
  }
  spec.budgets = eval::parse_budgets(a.budgets);  // checked even when no policy takes a budget
  eval::SweepOptions opt;
  opt.depths = parse_depths(a.depths);
  opt.samples = a.samples;
  opt.seed = a.seed;
  if (!a.text.empty()) opt.ppl_text = read_text_file(a.text);
  const std::vector<eval::CellKey> grid = eval::expand_grid(spec);  // budgets below a token fail here
  for (const eval::CellKey& k : grid) {  // every cell's knobs are valid before the model loads
    EngineArgs e = a.engine;
    e.knobs.budget = k.budget_tokens;
    (void)kv_policy_of(e, k.policy);
  }

  if (a.list) {  // the grid, and which cells the results file holds; no model needed
    std::vector<eval::CellResult> held;
    if (std::filesystem::exists(a.results)) held = eval::read_sweep_file(a.results).cells;
    for (const eval::CellKey& k : grid) {
      const bool done = std::any_of(held.begin(), held.end(), [&](const auto& c) { return c.key == k; });
      std::printf("%s %s\n", done ? "done" : "todo", k.label().c_str());
    }
    return 0;
  }
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  const int64_t train = model->config.n_ctx_train;
  for (int64_t len : spec.lengths) {
    if (train > 0 && len > train)
      fail(ErrorKind::kInvalidArgument, "--lengths: {} is beyond {}'s trained context of {} tokens", len,
           std::filesystem::path(a.engine.model).filename().string(), train);
  }
  std::optional<tokenizer::ChatTemplate> tmpl;
  if (!a.no_chat) {
    tmpl = tokenizer::chat_template_for(
        model->tokenizer->vocab(),
        a.chat_template.empty() ? std::nullopt : std::optional<std::string_view>(a.chat_template));
  }
  const runtime::SessionOptions base = session_options(a.engine, model->config, spec.lengths.front());
  eval::SweepHeader h;
  h.model = a.engine.model;
  h.model_name = std::filesystem::path(a.engine.model).stem().string();
  h.seed = a.seed;
  h.samples = a.samples;
  h.depths = opt.depths;
  const policy::PolicyKnobs& k = a.engine.knobs;
  h.settings = {{"chunk", base.chunk},
                {"chat_template", tmpl ? std::string(tokenizer::chat_template_name(*tmpl)) : "none"},
                {"isa", a.engine.isa.empty() ? "best" : a.engine.isa},
                {"kv_mem", a.engine.kv_mem},
                {"kv_home", a.engine.kv_disk.empty() ? "host" : "disk"},
                {"group", a.engine.group},
                {"static_heads", a.engine.static_heads},
                {"prefetch_depth", a.engine.prefetch_depth},
                {"sinks", k.sinks},
                {"window", k.window},
                {"h2o_recent", k.h2o_recent},
                {"quest_page", k.quest_page},
                {"kivi_group", k.kivi_group},
                {"kivi_residual", k.kivi_residual},
                {"ppl_text", a.text}};
  eval::SweepFile file(a.results, h);
  if (file.dropped_tail())
    std::fprintf(stderr,
                 "kvtier compare: %s ended in an incomplete line (a run cut short); it was removed and "
                 "its cell runs again\n",
                 a.results.c_str());
  opt.commit = source_commit();
  opt.machine = machine_description();
  opt.command = a.command;

  CompareEngine engine(*model, a.engine, tmpl);
  const int64_t ran = eval::run_sweep(engine, spec, opt, file, [](const eval::SweepProgress& p) {
    std::fprintf(stderr, "[compare %lld/%lld%s] %s | %s elapsed, ETA %s\n", static_cast<long long>(p.done),
                 static_cast<long long>(p.total),
                 p.resumed ? fmt::format(", {} from the file", p.resumed).c_str() : "", p.current.c_str(),
                 duration_text(p.elapsed_s).c_str(), duration_text(p.eta_s).c_str());
  });
  std::printf("%lld cells run, %zu in %s\n", static_cast<long long>(ran), file.cells().size(),
              a.results.c_str());
  print_summary(file.cells());
  if (!a.report.empty()) {
    eval::write_sweep_report(a.report, {eval::read_sweep_file(a.results)});
    std::printf("report: %s/README.md\n", a.report.c_str());
  }
  return 0;
}

int run_compare_report(const std::vector<std::string>& inputs, const std::string& report) {
  std::vector<eval::SweepRecord> records;
  for (const std::string& path : inputs) {
    bool torn = false;
    records.push_back(eval::read_sweep_file(path, &torn));
    if (torn)
      std::fprintf(stderr, "kvtier compare-report: %s: the incomplete last line is left out\n", path.c_str());
  }
  std::vector<eval::CellResult> cells;
  for (const auto& r : records) cells.insert(cells.end(), r.cells.begin(), r.cells.end());
  std::printf("%zu files, %zu cells\n", records.size(), cells.size());
  print_summary(cells);
  eval::write_sweep_report(report, records);
  std::printf("report: %s/README.md\n", report.c_str());
  return 0;
}

}  // namespace

void add_compare(CLI::App& app, Runner& run) {
  {
    struct ReportArgs {
      std::vector<std::string> inputs;
      std::string report;
    };
    auto r = std::make_shared<ReportArgs>();
    CLI::App* cmd = app.add_subcommand(
        "compare-report", "The report of kvtier compare results files (one model), without a model");
    cmd->add_option("results", r->inputs, "results files written by kvtier compare --results")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--report", r->report, "write README.md tables and SVG plots into this directory")
        ->required();
    cmd->callback([&run, r] { run = [r] { return run_compare_report(r->inputs, r->report); }; });
  }
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand(
      "compare",
      "Sweep KV policies x budgets x lengths x tasks into one report: accuracy relative to resident, KV "
      "bytes "
      "per tier, bytes moved, prefill and decode speed (tables and SVG plots). Resumable: each finished cell "
      "is appended to --results at once, and a run with the same file continues where the last stopped. A "
      "command of its own rather than `eval --sweep`: it adds a budget axis, sizes a fresh KV cache to each "
      "cell's length to measure memory and speed, and keeps a cell file rather than one JSON at the end");
  cmd->add_option("task", a->tasks,
                  "task or comma-separated tasks: " + eval::task_names() + "; 'niah-all'; 'all'")
      ->required();
  add_engine_flags(cmd, a->engine, /*with_policy=*/false);
  cmd->add_option(
         "--kv-policy", a->policies,
         "'all' (every policy `kvtier policies` lists that can run with these flags: the presets, and "
         "resident with each other axis value, or layer with those resident refuses; the ones left out "
         "are named on stderr, e.g. locret without --locret-heads) or a comma-separated list, which may "
         "include 'all' ('all,layer+quest'); resident is always run, as the reference")
      ->default_val(a->policies);
  cmd->add_option("--budgets", a->budgets,
                  "fractions of the context length for the policies that take --kv-budget (h2o, quest, "
                  "streaming: sinks + window), e.g. 1/2,1/4; --kv-budget = floor(length x fraction)")
      ->default_val(a->budgets);
  cmd->add_option("--lengths", a->lengths, "context lengths in tokens (prompt + answer), e.g. 2k,4k,8k")
      ->default_val(a->lengths);
  cmd->add_option("--depths", a->depths, "needle depths in [0, 1] (passkey, niah)")->default_val(a->depths);
  cmd->add_option("--samples", a->samples, "samples per cell and depth (ppl: windows per length)")
      ->default_val(a->samples)
      ->check(positive());
  cmd->add_option("--seed", a->seed, "seed of the generated prompts")->default_val(a->seed);
  cmd->add_option("--results", a->results,
                  "results file (JSON lines): created, or continued if it holds cells of the same sweep")
      ->required();
  cmd->add_option("--report", a->report,
                  "write README.md tables and SVG plots into this directory at the end");
  cmd->add_option("--text", a->text, "ppl: evaluate this text file instead of the generated essay");
  cmd->add_option("--chat-template", a->chat_template, "chat template name (default: the model's)");
  cmd->add_flag("--no-chat", a->no_chat, "send prompts as raw text, without the chat template");
  cmd->add_flag("--list", a->list,
                "print the grid's cells in run order, each 'done' (in --results) or 'todo', and exit");
  cmd->callback([&run, a] {
    a->command = command_line(*a);
    run = [a] { return run_compare(*a); };
  });
}

}  // namespace kvtier::cli
