// The compare sweep without a model: grid expansion, budgets, the resumable results file (a run cut
// short continues, an incomplete last line runs again, a corrupt line is an error), and the report
// from fake results.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_file.h"
#include "core/error.h"
#include "eval/sweep.h"
#include "eval/sweep_report.h"
#include "eval/sweep_run.h"
#include "eval/sweep_store.h"
#include "fake_engine.h"
#include "policy/kv_policy.h"

namespace kvtier::eval {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The oracle engine of the harness tests, configured per cell: under a budget below half the context
// it answers blindly; its "KV bytes" are 100 per token kept.
class FakeSweepEngine : public SweepEngine {
 public:
  void configure(const CellKey& cell) override {
    if (fail_at_ > 0 && configured == fail_at_ - 1) fail(ErrorKind::kInterrupted, "killed");
    ++configured;
    cell_ = cell;
    inner_.use_policy(cell.budget && cell.budget_tokens * 2 < cell.length ? "blind" : cell.config());
    tokens_ = 0;
  }
  void use_policy(const std::string& name) override { EXPECT_EQ(name, cell_.config()); }
  int64_t count_tokens(const Prompt& p) override { return inner_.count_tokens(p); }
  std::vector<int32_t> tokenize(std::string_view text) override { return inner_.tokenize(text); }
  std::string generate(const Prompt& p, int max_new) override {
    tokens_ += count_tokens(p);
    return inner_.generate(p, max_new);
  }
  void evaluate(std::span<const int32_t> t,
                const std::function<void(int64_t, std::span<const float>)>& fn) override {
    inner_.evaluate(t, fn);
  }
  CellMeasures measures() const override {
    CellMeasures m;
    const int64_t kept = cell_.budget ? cell_.budget_tokens : cell_.length;
    m.kv.device = static_cast<uint64_t>(kept) * 100;
    m.kv.host = cell_.policy == "layer" ? static_cast<uint64_t>(cell_.length) * 100 : 0;
    m.prefill_tokens = tokens_;
    m.prefill_s = static_cast<double>(tokens_) / 1000.0;
    m.decode_tokens = 10;
    m.decode_s = 0.5;
    return m;
  }
  int configured = 0;
  void fail_at(int n) { fail_at_ = n; }

 private:
  testing::FakeEngine inner_{"blind"};
  CellKey cell_;
  int64_t tokens_ = 0;
  int fail_at_ = 0;
};

SweepSpec spec() {
  SweepSpec s;
  s.tasks = {TaskKind::kPasskey, TaskKind::kNiah};
  s.lengths = {512, 256};
  s.policies = {{"resident", false}, {"layer", false}, {"resident+h2o", true}};
  s.budgets = {{1, 2}, {1, 4}};
  return s;
}

SweepOptions options() {
  SweepOptions o;
  o.depths = {0.5};
  o.samples = 1;
  o.seed = 3;
  o.commit = "abc";
  o.machine = "test";
  o.command = "kvtier compare test";
  return o;
}

SweepHeader header() {
  SweepHeader h;
  h.model = "m.gguf";
  h.model_name = "m";
  h.seed = 3;
  h.samples = 1;
  h.depths = {0.5};
  h.settings = {{"chunk", 512}};
  return h;
}

TEST(SweepGrid, ExpandsLengthsPoliciesBudgetsTasks) {
  const auto grid = expand_grid(spec());
  // 2 lengths x (resident + layer + h2o at 2 budgets) x 2 tasks.
  ASSERT_EQ(grid.size(), 2u * 4u * 2u);
  EXPECT_EQ(grid[0].length, 256);  // ascending lengths, the reference first
  EXPECT_EQ(grid[0].policy, "resident");
  EXPECT_EQ(grid[0].task, TaskKind::kPasskey);
  EXPECT_EQ(grid[1].task, TaskKind::kNiah);
  EXPECT_FALSE(grid[0].budget);
  EXPECT_EQ(grid[0].budget_tokens, 0);
  EXPECT_EQ(grid[4].config(), "resident+h2o@1/2");
  EXPECT_EQ(grid[4].budget_tokens, 128);
  EXPECT_EQ(grid[6].config(), "resident+h2o@1/4");
  EXPECT_EQ(grid[6].budget_tokens, 64);
  EXPECT_EQ(grid[14].budget_tokens, 128);  // 1/4 of 512
  EXPECT_EQ(grid[14].length, 512);
  EXPECT_EQ(grid[6].label(), "passkey 256 resident+h2o@1/4 (64 tokens)");
  for (size_t i = 0; i < grid.size(); ++i) {
    for (size_t j = i + 1; j < grid.size(); ++j) EXPECT_FALSE(grid[i] == grid[j]) << grid[i].label();
  }
}

TEST(SweepGrid, BudgetedPoliciesNeedBudgets) {
  SweepSpec s = spec();
  s.budgets.clear();
  EXPECT_THROW(expand_grid(s), Error);
  s.policies = {{"resident", false}};
  EXPECT_EQ(expand_grid(s).size(), 4u);  // no budgeted policy: no budget needed
  s.lengths.clear();
  EXPECT_THROW(expand_grid(s), Error);
}

TEST(SweepGrid, Budgets) {
  const auto b = parse_budgets("1/2,1/4,1/8,1/16");
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[3].text(), "1/16");
  EXPECT_EQ(budget_tokens(b[3], 2048), 128);
  EXPECT_EQ(budget_tokens(b[3], 16384), 1024);
  EXPECT_EQ(budget_tokens({1, 3}, 1000), 333);  // floor
  EXPECT_EQ(parse_budgets("1")[0].text(), "1");
  EXPECT_THROW(budget_tokens(b[3], 8), Error);  // below one token
  for (const char* bad : {"", "0", "3/2", "1/0", "x", "1/2,2/4", "1/", "/2", "-1/2", "1/2,"}) {
    EXPECT_THROW(parse_budgets(bad), Error) << bad;
  }
  try {
    parse_budgets("1/2,2/4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
}

TEST(SweepGrid, DiscoversEveryPolicyResidentFirst) {
  const auto all = discover_policies();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), "resident");
  for (const char* p : {"layer", "headinfer", "resident+sliding", "resident+f32"})
    EXPECT_NE(std::find(all.begin(), all.end(), p), all.end()) << p;
  for (const std::string& p : all) {
    EXPECT_EQ(policy::parse_kv_policy(p).spec(), p);  // canonical
    EXPECT_EQ(std::count(all.begin(), all.end(), p), 1);
  }
  // Every value of every axis appears in some discovered policy.
  for (const policy::AxisValue& v : policy::axis_values()) {
    bool found = false;
    for (const std::string& p : all)
      found |= policy::spec_names_axis(p, v.axis) && p.find(v.name) != std::string::npos;
    EXPECT_TRUE(found || v.name == "f16" || v.name == "all" || v.name == "none") << v.name;
  }
  // Budgets apply to the values that list --kv-budget, and only to those.
  for (const char* p : {"resident", "layer", "headinfer", "resident+sliding", "resident+f32"})
    EXPECT_FALSE(policy_takes_budget(p)) << p;
  for (const policy::AxisValue& v : policy::axis_values()) {
    if (std::string(v.flags).find("--kv-budget") == std::string::npos || v.axis == policy::Axis::kPlacement)
      continue;
    EXPECT_TRUE(policy_takes_budget(std::string("resident+") + std::string(v.name))) << v.name;
  }
  const auto sp = sweep_policies("layer,headinfer");
  ASSERT_EQ(sp.size(), 3u);  // resident added first, as the reference
  EXPECT_EQ(sp[0].spec, "resident");
  EXPECT_EQ(sp[1].spec, "layer");
  EXPECT_EQ(sweep_policies("layer,resident")[0].spec, "resident");
  EXPECT_THROW(sweep_policies("no-such"), Error);
}

TEST(SweepGrid, DiscoveryWithACheckKeepsRunnablePoliciesAndFallsBackToLayer) {
  // A check that refuses infinigen and kvpr on the resident placement and locret everywhere.
  const PolicyCheck check = [](const std::string& s) -> std::string {
    if (s.rfind("resident+infinigen", 0) == 0 || s.rfind("resident+kvpr", 0) == 0) return "offloaded only";
    if (s.find("locret") != std::string::npos) return "no heads";
    return {};
  };
  std::vector<SkippedPolicy> skipped;
  const auto all = discover_policies(check, &skipped);
  const auto has = [&](const char* p) { return std::find(all.begin(), all.end(), p) != all.end(); };
  EXPECT_TRUE(has("layer+infinigen") && has("layer+kvpr") && has("resident+quest"));
  EXPECT_FALSE(has("resident+infinigen") || has("resident+kvpr") || has("resident+locret"));
  for (const std::string& p : all) EXPECT_EQ(std::count(all.begin(), all.end(), p), 1) << p;
  // locret is skipped once, with the check's reason; kvpr and infinigen are not (layer runs them).
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].spec, "resident+locret");
  EXPECT_EQ(skipped[0].reason, "no heads");
  // "all" inside a list, with extra policies; one that "all" discovers too is not repeated.
  const auto sp = sweep_policies("all,layer+quest,layer", check);
  EXPECT_EQ(sp[0].spec, "resident");
  EXPECT_EQ(std::count_if(sp.begin(), sp.end(), [](const SweepPolicy& p) { return p.spec == "layer"; }), 1);
  EXPECT_EQ(sp.back().spec, "layer+quest");
  EXPECT_TRUE(sp.back().budgeted);
  EXPECT_EQ(sp.size(), all.size() + 1);
  EXPECT_THROW(sweep_policies("all,,layer"), Error);
  EXPECT_THROW(sweep_policies("layer,layer"), Error);
}

TEST(SweepFile, RunsEveryCellOnceAndResumesAfterAKill) {
  test::TempFile tmp("kvtier_sweep", ".jsonl");
  const size_t total = expand_grid(spec()).size();
  {
    FakeSweepEngine e;
    e.fail_at(6);  // killed while setting up the 6th cell: 5 are in the file
    SweepFile f(tmp.str(), header());
    EXPECT_THROW(run_sweep(e, spec(), options(), f), Error);
    EXPECT_EQ(f.cells().size(), 5u);
  }
  const std::string after_kill = read_all(tmp.str());
  {
    FakeSweepEngine e;
    SweepFile f(tmp.str(), header());
    EXPECT_FALSE(f.dropped_tail());
    EXPECT_EQ(f.cells().size(), 5u);
    std::vector<SweepProgress> seen;
    EXPECT_EQ(run_sweep(e, spec(), options(), f, [&](const SweepProgress& p) { seen.push_back(p); }),
              static_cast<int64_t>(total - 5));
    EXPECT_EQ(e.configured, static_cast<int>(total - 5));  // nothing ran twice
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.front().resumed, 5);
    EXPECT_EQ(seen.back().done, static_cast<int64_t>(total));
  }
  const std::string text = read_all(tmp.str());
  EXPECT_EQ(text.substr(0, after_kill.size()), after_kill);  // appended, never rewritten
  const SweepRecord rec = read_sweep_file(tmp.str());
  ASSERT_EQ(rec.cells.size(), total);
  EXPECT_EQ(rec.header, header());
  const auto grid = expand_grid(spec());
  for (size_t i = 0; i < total; ++i) EXPECT_EQ(rec.cells[i].key, grid[i]);
  // A third run has nothing left to do.
  FakeSweepEngine e;
  SweepFile f(tmp.str(), header());
  EXPECT_EQ(run_sweep(e, spec(), options(), f), 0);
  EXPECT_EQ(e.configured, 0);
  // Round trip of a cell: samples, measures, metadata.
  const CellResult& c = rec.cells[4];
  EXPECT_EQ(c.key.config(), "resident+h2o@1/2");
  EXPECT_EQ(c.kv.device, 128u * 100u);
  EXPECT_EQ(c.decode_tokens, 10);
  EXPECT_EQ(c.command, "kvtier compare test");
  ASSERT_EQ(c.samples.size(), 1u);
  EXPECT_EQ(c.samples[0].depth_index, 0);
  EXPECT_EQ(c.samples[0].score, 1.0);             // budget 1/2: the fake engine still answers
  EXPECT_EQ(rec.cells[6].samples[0].score, 0.0);  // 1/4: blind
}

TEST(SweepFile, IncompleteLastLineRunsItsCellAgain) {
  test::TempFile tmp("kvtier_sweep_torn", ".jsonl");
  {
    FakeSweepEngine e;
    e.fail_at(4);
    SweepFile f(tmp.str(), header());
    EXPECT_THROW(run_sweep(e, spec(), options(), f), Error);
  }
  std::string text = read_all(tmp.str());
  // A fourth line cut short in the middle of a write.
  const size_t last = text.rfind('\n', text.size() - 2);
  const std::string torn = text.substr(last + 1, (text.size() - last) / 2);
  {
    std::ofstream out(tmp.str(), std::ios::binary | std::ios::app);
    out << torn;
  }
  bool dropped = false;
  EXPECT_EQ(read_sweep_file(tmp.str(), &dropped).cells.size(), 3u);
  EXPECT_TRUE(dropped);
  FakeSweepEngine e;
  SweepFile f(tmp.str(), header());
  EXPECT_TRUE(f.dropped_tail());
  EXPECT_EQ(read_all(tmp.str()), text);  // cut back to the last complete line
  run_sweep(e, spec(), options(), f);
  EXPECT_EQ(e.configured, static_cast<int>(expand_grid(spec()).size()) - 3);
  EXPECT_EQ(read_sweep_file(tmp.str()).cells.size(), expand_grid(spec()).size());
}

TEST(SweepFile, CorruptLineIsAnErrorNamingIt) {
  test::TempFile tmp("kvtier_sweep_bad", ".jsonl");
  {
    FakeSweepEngine e;
    e.fail_at(3);
    SweepFile f(tmp.str(), header());
    EXPECT_THROW(run_sweep(e, spec(), options(), f), Error);
  }
  std::string text = read_all(tmp.str());
  const size_t second = text.find('\n') + 1;  // line 2: the first cell
  text[second + 3] = '#';
  {
    std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
    out << text;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) {
        read_sweep_file(tmp.str());
      } else {
        SweepFile f(tmp.str(), header());
      }
      FAIL() << "a corrupt line was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
      EXPECT_NE(std::string(e.what()).find(tmp.str() + ":2:"), std::string::npos) << e.what();
    }
  }
  // A valid JSON line that is not a cell is an error too.
  {
    std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
    out << header_json(header()).dump() << "\n{\"task\":\"niah\"}\n";
  }
  EXPECT_THROW(read_sweep_file(tmp.str()), Error);
}

TEST(SweepFile, DifferentSettingsAreAnError) {
  test::TempFile tmp("kvtier_sweep_hdr", ".jsonl");
  { SweepFile f(tmp.str(), header()); }
  SweepHeader h = header();
  h.seed = 4;
  try {
    SweepFile f(tmp.str(), h);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seed"), std::string::npos) << e.what();
  }
  h = header();
  h.settings["chunk"] = 256;
  try {
    SweepFile f(tmp.str(), h);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 512"), std::string::npos) << e.what();
  }
  SweepFile same(tmp.str(), header());  // the same settings continue
  EXPECT_TRUE(same.cells().empty());
}

TEST(SweepReport, SummaryTablesAndPlotsFromFakeResults) {
  test::TempFile tmp("kvtier_sweep_rep", ".jsonl");
  FakeSweepEngine e;
  SweepFile f(tmp.str(), header());
  run_sweep(e, spec(), options(), f);
  const SweepRecord rec = read_sweep_file(tmp.str());
  const auto rows = summarize(rec.cells);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].config, "resident");
  EXPECT_DOUBLE_EQ(rows[0].kv_ratio, 1.0);
  EXPECT_DOUBLE_EQ(rows[0].rel_accuracy, 1.0);
  EXPECT_EQ(rows[1].config, "layer");
  EXPECT_DOUBLE_EQ(rows[1].kv_ratio, 2.0);  // device + host
  EXPECT_EQ(rows[2].config, "resident+h2o@1/2");
  EXPECT_DOUBLE_EQ(rows[2].kv_ratio, 0.5);
  EXPECT_DOUBLE_EQ(rows[2].rel_accuracy, 1.0);
  EXPECT_DOUBLE_EQ(rows[2].same_answers, 1.0);
  EXPECT_EQ(rows[3].config, "resident+h2o@1/4");
  EXPECT_DOUBLE_EQ(rows[3].kv_ratio, 0.25);
  EXPECT_DOUBLE_EQ(rows[3].rel_accuracy, 0.0);
  EXPECT_DOUBLE_EQ(rows[3].same_answers, 0.0);

  const auto files = sweep_report_files({rec});
  ASSERT_TRUE(files.count("README.md"));
  const std::string& md = files.at("README.md");
  EXPECT_NE(md.find("| resident+h2o | 1/4 | 0.250 | 0.0% | 0.0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 256 | layer | - | 25.0 KiB | 25.0 KiB | 0 B | 2.000 |"), std::string::npos) << md;
  EXPECT_NE(md.find("#### passkey"), std::string::npos);
  EXPECT_NE(md.find("| resident+h2o | 1/2 | 100.0 (1.00) | 100.0 (1.00) |"), std::string::npos) << md;
  EXPECT_EQ(md.find("Incomplete"), std::string::npos);
  for (const char* svg :
       {"accuracy-vs-compression-passkey.svg", "accuracy-vs-compression-niah.svg", "speed-vs-context.svg"}) {
    ASSERT_TRUE(files.count(svg)) << svg;
    EXPECT_EQ(files.at(svg).rfind("<svg ", 0), 0u) << svg;
    EXPECT_NE(files.at(svg).find("</svg>"), std::string::npos) << svg;
  }
  const std::string& acc = files.at("accuracy-vs-compression-niah.svg");
  EXPECT_NE(acc.find(">resident+h2o<"), std::string::npos);
  EXPECT_NE(acc.find(">@1/4<"), std::string::npos);  // budgets label their points
  EXPECT_NE(acc.find(">1<"), std::string::npos);     // x ticks are powers of two, 1 = resident
  const std::string& speed = files.at("speed-vs-context.svg");
  EXPECT_NE(speed.find("budgets at 1/2"), std::string::npos);
  EXPECT_NE(speed.find("budgets at 1/4"), std::string::npos);

  // A partial sweep says which cells are missing.
  SweepRecord part = rec;
  part.cells.pop_back();
  const std::string partial = sweep_markdown({part}, "plots/");
  EXPECT_NE(partial.find("**Incomplete**: 1 of the 16 cells"), std::string::npos) << partial;
  EXPECT_NE(partial.find("niah 512 resident+h2o@1/4"), std::string::npos);
  EXPECT_NE(partial.find("](plots/speed-vs-context.svg)"), std::string::npos);
  // The summary pools over the lengths every configuration ran (here 256 only), so that rows compare.
  EXPECT_NE(partial.find("Over the lengths 256 (those at which every configuration ran every task)"),
            std::string::npos)
      << partial;
  EXPECT_NE(md.find("Over the lengths 256, 512 (those"), std::string::npos);
  EXPECT_NE(partial.find("| resident+h2o | 1/4 | 0.250 | 0.0% | 0.0% |"), std::string::npos) << partial;
}

TEST(SweepReport, RelativeAccuracy) {
  CellResult res, c;
  res.key.task = c.key.task = TaskKind::kNiah;
  SampleResult s;
  s.score = 0.5;
  res.samples = {s};
  s.score = 0.25;
  c.samples = {s};
  EXPECT_DOUBLE_EQ(relative_accuracy(c, res), 0.5);
  res.samples[0].score = 0;
  EXPECT_TRUE(std::isnan(relative_accuracy(c, res)));  // undefined when resident scored nothing
  res.key.task = c.key.task = TaskKind::kPpl;
  SampleResult p;
  p.nll_sum = std::log(4.0) * 10;
  p.n_scored = 10;
  res.samples = {p};
  p.nll_sum = std::log(8.0) * 10;
  c.samples = {p};
  EXPECT_NEAR(relative_accuracy(c, res), 0.5, 1e-12);  // perplexity 8 vs resident's 4
}

}  // namespace
}  // namespace kvtier::eval
