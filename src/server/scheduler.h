// Continuous batching: requests join and leave the running batch between forward passes. One thread
// owns the Session and runs steps; each step carries one decode token of every generating request
// and prefill pieces of the newer ones, as many tokens as the session's chunk allows (Session::step).
// A request that finds every sequence busy waits in a bounded queue; past it, submit() refuses it.
// Each request has its own sampler (params, seed), stop strings and max tokens; its text is handed
// out piece by piece through its RequestHandle. A cancelled request (client gone) leaves the batch
// at the next step boundary.
//
// Prefix reuse: a finished request's sequence keeps its KV (its tokens are remembered). A new request
// takes the free sequence whose tokens share the longest prefix with its prompt, truncates it to that
// prefix and prefills only the rest. Truncation works on every placement (resident, layer,
// headinfer, disk home), so the reuse does too; where sliding retention already freed what the
// prefix would attend, the sequence starts from empty. The results are those of a full prefill
// (exact passes do not depend on how tokens are split into passes).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/text_stream.h"

namespace kvtier::server {

using model::TokenId;

struct GenRequest {
  std::vector<TokenId> prompt;
  runtime::SamplerParams sampling;
  int64_t max_tokens = 16;  // capped by the context
  std::vector<std::string> stop;
  bool ignore_eos = false;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // OpenAI's names: stop, length, cancelled, error

// A piece of a request's output; the last one has done = true and the totals.
struct GenEvent {
  std::string text;
  bool done = false;
  FinishReason reason = FinishReason::kStop;
  std::string error;  // kError: what went wrong
  int64_t n_prompt = 0;
  int64_t n_gen = 0;
  int64_t n_reused = 0;  // prompt tokens whose KV came from a cached prefix
};

// Shared by the request's consumer (an HTTP thread) and the scheduler.
class RequestHandle {
 public:
  // Waits up to `timeout` for the next event; false if none came.
  bool next(GenEvent& ev, std::chrono::milliseconds timeout);
  // The consumer is gone: the request leaves the batch at the next step and its sequence is freed.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Scheduler side.
  void push(GenEvent ev);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct SchedulerOptions {
  size_t max_queue = 64;  // requests waiting for a sequence; more are refused
};

// What /metrics reports (a consistent snapshot, taken after each step).
struct SchedulerStats {
  uint64_t requests_done = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_failed = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t reused_tokens = 0;  // prompt tokens not recomputed thanks to a cached prefix
  uint64_t steps = 0;
  uint64_t step_tokens = 0;
  double step_seconds = 0;
  size_t queued = 0;
  size_t active = 0;
  uint32_t max_seqs = 0;
  uint64_t kv_bytes[3] = {0, 0, 0};  // [tier] KV bytes reserved: device, host, disk
  uint64_t bytes_loaded = 0;         // offloaded placements: home tier -> compute
  uint64_t bytes_stored = 0;
  double stall_seconds = 0;  // compute waiting on transfers
};

// submit() refuses a request when the queue is full (HTTP 429).
class QueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Scheduler {
 public:
  Scheduler(runtime::Session& session, SchedulerOptions opt);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Throws QueueFull past the queue's bound, Error(kInvalidArgument) for a prompt
  // that is empty or does not fit the context.
  std::shared_ptr<RequestHandle> submit(GenRequest r);
  SchedulerStats stats() const;
  // Finishes the running requests as cancelled and stops the thread.
  void stop();

 private:
  struct Slot {
    std::shared_ptr<RequestHandle> h;  // null: free (its KV may hold a cached prefix)
    GenRequest req;
    std::vector<TokenId> kv_tokens;  // the tokens whose KV the sequence holds
    size_t fed = 0;                  // prompt tokens in the KV
    std::vector<int64_t> pieces;     // planned_: the prompt's prefill passes (token counts)
    size_t piece = 0;                // the next of them
    TokenId next = -1;               // sampled, to be fed by the next step
    std::unique_ptr<runtime::Sampler> sampler;
    std::vector<TokenId> history;
    std::unique_ptr<runtime::TextStream> text;
    int64_t n_gen = 0;
    int64_t n_reused = 0;
  };
  struct Pending {
    std::shared_ptr<RequestHandle> h;
    GenRequest req;
  };

  void loop();
  void admit(Pending p);
  void finish(Slot& s, FinishReason reason, std::string error = {});
  void after_logits(Slot& s, std::span<const float> logits);
  void snapshot();

  runtime::Session& session_;
  SchedulerOptions opt_;
  // An approximate policy's result can depend on where a prompt's passes end (Session::prefill_cuts_matter):
  // then prompts are fed in pieces planned at admission, in passes of at most piece_chunk_ tokens (the
  // chunk less room for a decode token of every other sequence, so a piece always fits beside them),
  // and a request's result does not depend on what else runs. Otherwise pieces fill each pass.
  bool planned_ = false;
  int64_t piece_chunk_ = 1;
  std::vector<Slot> slots_;  // [max sequences] slot i runs sequence i
  std::vector<model::SeqTokens> parts_;
  std::vector<size_t> part_slot_;
  size_t rotate_ = 0;  // the slot each step starts from

  mutable std::mutex mu_;  // guards queue_, stopping_, stats_
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  SchedulerStats stats_;
  std::thread thread_;
};

}  // namespace kvtier::server
