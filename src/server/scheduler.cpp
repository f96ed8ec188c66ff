#include "server/scheduler.h"

#include <algorithm>

#include "core/error.h"
#include "kv/ledger.h"

namespace kvtier::server {
namespace {

using Clock = std::chrono::steady_clock;

size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

bool RequestHandle::next(GenEvent& ev, std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return false;
  ev = std::move(events_.front());
  events_.pop_front();
  return true;
}

void RequestHandle::push(GenEvent ev) {
  {
    std::lock_guard lk(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

Scheduler::Scheduler(runtime::Session& session, SchedulerOptions opt) : session_(session), opt_(opt) {
  slots_.resize(session_.max_sequences());
  planned_ = session_.prefill_cuts_matter();
  piece_chunk_ = std::max<int64_t>(1, session_.chunk() - (session_.max_batch() - 1));
  stats_.max_seqs = session_.max_sequences();
  snapshot();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestHandle> Scheduler::submit(GenRequest r) {
  if (r.prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt has no tokens");
  runtime::check_sampler_params(r.sampling);  // here, not on the scheduler's thread when it starts
  const auto n_ctx = session_.n_ctx();
  if (static_cast<int64_t>(r.prompt.size()) >= n_ctx) {
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens; this server's context holds {} (prompt and completion together)",
         r.prompt.size(), n_ctx);
  }
  for (TokenId id : r.prompt) {
    if (id < 0 || static_cast<uint32_t>(id) >= session_.model().config.n_vocab) {
      fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id,
           session_.model().config.n_vocab);
    }
  }
  auto h = std::make_shared<RequestHandle>();
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw QueueFull("the server is shutting down");
    if (queue_.size() >= opt_.max_queue) {
      throw QueueFull(
          fmt::format("all {} sequences are busy and {} requests are already waiting; retry later",
                      slots_.size(), queue_.size()));
    }
    queue_.push_back({h, std::move(r)});
    stats_.queued = queue_.size();
  }
  cv_.notify_all();
  return h;
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

void Scheduler::admit(Pending p) {
  // The free sequence whose cached tokens share the longest prefix with the prompt (else the first
  // free one).
  size_t best = slots_.size();
  size_t best_len = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].h) continue;
    const size_t len = common_prefix(slots_[i].kv_tokens, p.req.prompt);
    if (best == slots_.size() || len > best_len) {
      best = i;
      best_len = len;
    }
  }
  KVTIER_ASSERT(best < slots_.size(), "admit without a free sequence");
  Slot& s = slots_[best];
  const auto seq = static_cast<kv::SeqId>(best);
  // At least one prompt token is fed again: its logits start the generation.
  size_t keep = std::min(best_len, p.req.prompt.size() - 1);
  try {
    session_.truncate(seq, static_cast<int64_t>(keep));
  } catch (const Error&) {  // sliding retention freed what the prefix attends: start from empty
    keep = 0;
    session_.truncate(seq, 0);
  }
  s.h = std::move(p.h);
  s.req = std::move(p.req);
  s.kv_tokens.resize(keep);
  s.fed = keep;
  s.pieces.clear();
  if (planned_)
    s.pieces = session_.plan_prefill(seq, static_cast<int64_t>(s.req.prompt.size() - keep), piece_chunk_);
  s.piece = 0;
  s.next = -1;
  s.sampler = std::make_unique<runtime::Sampler>(s.req.sampling, session_.model().config.n_vocab);
  s.history = s.req.prompt;
  s.text = std::make_unique<runtime::TextStream>(*session_.model().tokenizer, s.req.stop);
  s.n_gen = 0;
  s.n_reused = static_cast<int64_t>(keep);
}

void Scheduler::finish(Slot& s, FinishReason reason, std::string error) {
  GenEvent ev;
  if (reason != FinishReason::kCancelled && reason != FinishReason::kError) ev.text = s.text->finish();
  ev.done = true;
  ev.reason = reason;
  ev.error = std::move(error);
  ev.n_prompt = static_cast<int64_t>(s.req.prompt.size());
  ev.n_gen = s.n_gen;
  ev.n_reused = s.n_reused;
  {
    std::lock_guard lk(mu_);
    if (reason == FinishReason::kCancelled) ++stats_.requests_cancelled;
    if (reason == FinishReason::kError) ++stats_.requests_failed;
    if (reason == FinishReason::kStop || reason == FinishReason::kLength) ++stats_.requests_done;
    stats_.prompt_tokens += ev.n_prompt;
    stats_.generated_tokens += static_cast<uint64_t>(s.n_gen);
    stats_.reused_tokens += static_cast<uint64_t>(s.n_reused);
  }
  s.h->push(std::move(ev));
  s.h.reset();
  s.sampler.reset();
  s.text.reset();
  s.history = {};
  s.next = -1;
  if (reason == FinishReason::kCancelled || reason == FinishReason::kError) {
    // Freed at once (a cancelled prompt may be half prefilled; an error leaves nothing to trust).
    const auto seq = static_cast<kv::SeqId>(&s - slots_.data());
    session_.truncate(seq, 0);
    s.kv_tokens.clear();
  }
}

void Scheduler::after_logits(Slot& s, std::span<const float> logits) {
  const tokenizer::Tokenizer& tok = *session_.model().tokenizer;
  const TokenId id = s.sampler->sample(logits, s.history);
  s.history.push_back(id);
  ++s.n_gen;
  if (!s.req.ignore_eos && tok.is_end_of_generation(id)) return finish(s, FinishReason::kStop);
  GenEvent ev;
  ev.text = s.text->push(id);
  if (!ev.text.empty()) s.h->push(std::move(ev));
  if (s.text->stopped()) return finish(s, FinishReason::kStop);
  if (s.n_gen >= s.req.max_tokens) return finish(s, FinishReason::kLength);
  const auto seq = static_cast<kv::SeqId>(&s - slots_.data());
  if (session_.n_past(seq) >= session_.n_ctx()) return finish(s, FinishReason::kLength);
  s.next = id;
}

void Scheduler::snapshot() {
  SchedulerStats& st = stats_;  // called with mu_ held, or before the thread starts
  const kv::MemoryLedger& l = session_.ledger();
  for (int t = 0; t < 3; ++t) st.kv_bytes[t] = l.current(static_cast<kv::Tier>(t), kv::Category::kKv);
  if (const auto ts = session_.kv_stats()) {
    st.bytes_loaded = ts->transfer.bytes_loaded;
    st.bytes_stored = ts->transfer.bytes_stored;
    st.stall_seconds = ts->transfer.wait_seconds;
  }
  size_t active = 0;
  for (const Slot& s : slots_) active += s.h ? 1 : 0;
  st.active = active;
  st.queued = queue_.size();
}

void Scheduler::loop() {
  const size_t V = session_.model().config.n_vocab;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      auto has_work = [&] {
        if (stopping_ || !queue_.empty()) return true;
        return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.h != nullptr; });
      };
      cv_.wait(lk, has_work);
      if (stopping_) break;
      // Requests join between steps while sequences are free.
      while (!queue_.empty() &&
             std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.h == nullptr; })) {
        Pending p = std::move(queue_.front());
        queue_.pop_front();
        if (p.h->cancelled()) {
          GenEvent ev;
          ev.done = true;
          ev.reason = FinishReason::kCancelled;
          p.h->push(std::move(ev));
          ++stats_.requests_cancelled;
          continue;
        }
        admit(std::move(p));
      }
      stats_.queued = queue_.size();
    }
    // Requests whose client left go now.
    for (Slot& s : slots_) {
      if (s.h && s.h->cancelled()) finish(s, FinishReason::kCancelled);
    }
    // The step: a decode token of each generating request, then prompt pieces while the chunk and
    // the batch have room.
    parts_.clear();
    part_slot_.clear();
    int64_t budget = session_.chunk();
    const auto max_parts = static_cast<size_t>(session_.max_batch());
    const size_t n_slots = slots_.size();
    // Slots are visited from a rotating start, so that when more requests run than one pass may
    // carry, each gets its turn.
    for (size_t j = 0; j < n_slots && budget > 0 && parts_.size() < max_parts; ++j) {
      const size_t i = (rotate_ + j) % n_slots;
      Slot& s = slots_[i];
      if (!s.h || s.next < 0) continue;
      parts_.push_back({static_cast<kv::SeqId>(i), {&s.next, 1}, model::LogitRows::kLast});
      part_slot_.push_back(i);
      --budget;
    }
    for (size_t j = 0; j < n_slots && budget > 0 && parts_.size() < max_parts; ++j) {
      const size_t i = (rotate_ + j) % n_slots;
      Slot& s = slots_[i];
      if (!s.h || s.fed == s.req.prompt.size()) continue;
      const size_t m = planned_ ? static_cast<size_t>(s.pieces[s.piece])
                                : std::min<size_t>(static_cast<size_t>(budget), s.req.prompt.size() - s.fed);
      if (static_cast<int64_t>(m) > budget) continue;  // a later step (one always has room for it)
      if (planned_) ++s.piece;
      const bool last = s.fed + m == s.req.prompt.size();
      parts_.push_back({static_cast<kv::SeqId>(i), std::span(s.req.prompt).subspan(s.fed, m),
                        last ? model::LogitRows::kLast : model::LogitRows::kNone});
      part_slot_.push_back(i);
      budget -= static_cast<int64_t>(m);
    }
    rotate_ = (rotate_ + 1) % n_slots;
    if (parts_.empty()) {  // every request left: the gauges say so now
      std::lock_guard lk(mu_);
      snapshot();
      continue;
    }
    const auto t0 = Clock::now();
    std::span<const float> logits;
    try {
      logits = session_.step(parts_);
    } catch (const std::exception& e) {
      // The pass was aborted for all of them: each request of the step fails with the reason.
      for (size_t slot : part_slot_) {
        if (slots_[slot].h) finish(slots_[slot], FinishReason::kError, e.what());
      }
      continue;
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    size_t row = 0;
    int64_t n_tokens = 0;
    for (size_t i = 0; i < parts_.size(); ++i) {
      Slot& s = slots_[part_slot_[i]];
      const auto& part = parts_[i];
      n_tokens += static_cast<int64_t>(part.tokens.size());
      s.kv_tokens.insert(s.kv_tokens.end(), part.tokens.begin(), part.tokens.end());
      if (s.next < 0) s.fed += part.tokens.size();  // a prompt piece
      if (part.rows == model::LogitRows::kNone) continue;
      const auto l = logits.subspan(row++ * V, V);
      if (s.h) after_logits(s, l);
    }
    std::lock_guard lk(mu_);
    ++stats_.steps;
    stats_.step_tokens += static_cast<uint64_t>(n_tokens);
    stats_.step_seconds += dt;
    snapshot();
  }
  // Shutting down: whoever still waits learns it.
  for (Slot& s : slots_) {
    if (s.h) finish(s, FinishReason::kCancelled);
  }
  std::lock_guard lk(mu_);
  for (Pending& p : queue_) {
    GenEvent ev;
    ev.done = true;
    ev.reason = FinishReason::kCancelled;
    p.h->push(std::move(ev));
  }
  queue_.clear();
}

}  // namespace kvtier::server
