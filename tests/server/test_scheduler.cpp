// The continuous batching scheduler on a tiny synthetic model: requests submitted together give the
// greedy text each gives alone (run through runtime::generate); a bounded queue refuses the request
// past it; a cancelled request frees its sequence; a prompt extending a finished one reuses its KV and
// still gives the text of a full prefill.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "common/temp_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/generate.h"
#include "server/scheduler.h"

namespace kvtier::server {
namespace {

using namespace std::chrono_literals;

std::string synth_file() {
  static std::unique_ptr<::kvtier::test::TempFile> f;
  if (!f) {
    f = std::make_unique<::kvtier::test::TempFile>("kvtier_test_sched_tiny_llama", ".gguf");
    model::SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.seed = 5;
    o.n_ctx = 512;
    model::synth_writer(*model::find_preset("tiny-llama"), o).write(f->str());
  }
  return f->str();
}

runtime::SessionOptions options(uint32_t seqs) {
  runtime::SessionOptions o;
  o.n_ctx = 512;
  o.chunk = 24;
  o.threads = 2;
  o.kv_block_tokens = 64;
  o.kv_placement.max_seqs = seqs;
  return o;
}

std::vector<TokenId> prompt(size_t n, int salt) {
  std::vector<TokenId> t;
  for (size_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * (7 + salt) + 3 * salt + 1) % 250 + 3));
  return t;
}

// Every event of a request until it is done (bounded wait).
std::pair<std::string, GenEvent> collect(RequestHandle& h) {
  std::string text;
  for (int i = 0; i < 600; ++i) {
    GenEvent ev;
    if (!h.next(ev, 100ms)) continue;
    text += ev.text;
    if (ev.done) return {text, ev};
  }
  ADD_FAILURE() << "no end within 60 s";
  return {text, {}};
}

std::string alone(const runtime::LoadedModel& m, const std::vector<TokenId>& p, int64_t n) {
  runtime::Session s(m, options(1));
  runtime::Sampler sampler({}, m.config.n_vocab);
  std::vector<TokenId> history;
  runtime::GenerateOptions g;
  g.max_tokens = n;
  g.ignore_eos = true;
  return runtime::generate(s, sampler, p, g, history).text;
}

GenRequest greedy(std::vector<TokenId> p, int64_t n) {
  GenRequest r;
  r.prompt = std::move(p);
  r.max_tokens = n;
  r.ignore_eos = true;
  return r;
}

TEST(Scheduler, ConcurrentRequestsGiveWhatEachGivesAlone) {
  const auto m = runtime::load_model(synth_file());
  runtime::Session s(*m, options(3));
  Scheduler sched(s, {8});
  std::vector<std::shared_ptr<RequestHandle>> hs;
  std::vector<std::vector<TokenId>> ps;
  for (int i = 0; i < 5; ++i) {  // 5 requests, 3 sequences: two wait in the queue
    ps.push_back(prompt(10 + 13 * static_cast<size_t>(i), i));
    hs.push_back(sched.submit(greedy(ps.back(), 12)));
  }
  for (int i = 0; i < 5; ++i) {
    const auto [text, ev] = collect(*hs[static_cast<size_t>(i)]);
    EXPECT_EQ(ev.reason, FinishReason::kLength);
    EXPECT_EQ(ev.n_gen, 12);
    EXPECT_EQ(text, alone(*m, ps[static_cast<size_t>(i)], 12)) << "request " << i;
  }
  const SchedulerStats st = sched.stats();
  EXPECT_EQ(st.requests_done, 5u);
  EXPECT_LT(st.steps, 5u * 13u);  // requests shared passes
}

TEST(Scheduler, QueuePastItsBoundIsRefused) {
  const auto m = runtime::load_model(synth_file());
  runtime::Session s(*m, options(1));
  Scheduler sched(s, {1});
  auto a = sched.submit(greedy(prompt(20, 1), 400));
  GenEvent first;
  while (!a->next(first, 100ms)) {  // a runs (its first text came)
  }
  auto b = sched.submit(greedy(prompt(20, 2), 4));  // waits: the one sequence is busy
  EXPECT_THROW(sched.submit(greedy(prompt(20, 3), 4)), QueueFull);
  EXPECT_EQ(sched.stats().queued, 1u);
  a->cancel();
  EXPECT_EQ(collect(*a).second.reason, FinishReason::kCancelled);
  EXPECT_EQ(collect(*b).second.reason, FinishReason::kLength);
}

TEST(Scheduler, CancelFreesTheSequenceAndPrefixIsReused) {
  const auto m = runtime::load_model(synth_file());
  runtime::Session s(*m, options(1));
  Scheduler sched(s, {4});
  auto a = sched.submit(greedy(prompt(30, 1), 400));
  GenEvent ev;
  while (!a->next(ev, 100ms)) {
  }
  a->cancel();
  EXPECT_EQ(collect(*a).second.reason, FinishReason::kCancelled);
  // The next request starts from an empty sequence (a cancelled one is freed, not cached).
  const auto p = prompt(60, 2);
  auto b = sched.submit(greedy(std::vector<TokenId>(p.begin(), p.begin() + 40), 5));
  EXPECT_EQ(collect(*b).second.n_reused, 0);
  // A prompt extending b's reuses its 40 prompt tokens and 4 of the 5 generated ones are not in it,
  // so exactly the common prefix is reused; the text is that of a full prefill.
  auto c = sched.submit(greedy(p, 6));
  const auto [text, done] = collect(*c);
  EXPECT_EQ(done.n_reused, 40);
  EXPECT_EQ(text, alone(*m, p, 6));
  EXPECT_EQ(sched.stats().reused_tokens, 40u);
}

}  // namespace
}  // namespace kvtier::server
