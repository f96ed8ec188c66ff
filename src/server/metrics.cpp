#include "server/metrics.h"

#include <fmt/format.h>

namespace kvtier::server {
namespace {

void metric(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

std::string prometheus_text(const SchedulerStats& s, const std::map<int, uint64_t>& by_status) {
  std::string o;
  metric(o, "kvtier_http_responses_total", "counter", "HTTP responses by status code");
  for (const auto& [code, n] : by_status)
    o += fmt::format("kvtier_http_responses_total{{code=\"{}\"}} {}\n", code, n);
  metric(o, "kvtier_requests_total", "counter", "generation requests by outcome");
  o += fmt::format("kvtier_requests_total{{outcome=\"done\"}} {}\n", s.requests_done);
  o += fmt::format("kvtier_requests_total{{outcome=\"cancelled\"}} {}\n", s.requests_cancelled);
  o += fmt::format("kvtier_requests_total{{outcome=\"failed\"}} {}\n", s.requests_failed);
  metric(o, "kvtier_prompt_tokens_total", "counter", "prompt tokens of finished requests");
  o += fmt::format("kvtier_prompt_tokens_total {}\n", s.prompt_tokens);
  metric(o, "kvtier_prompt_tokens_reused_total", "counter",
         "prompt tokens whose KV came from a cached prefix");
  o += fmt::format("kvtier_prompt_tokens_reused_total {}\n", s.reused_tokens);
  metric(o, "kvtier_generated_tokens_total", "counter", "generated tokens of finished requests");
  o += fmt::format("kvtier_generated_tokens_total {}\n", s.generated_tokens);
  metric(o, "kvtier_queue_length", "gauge", "requests waiting for a sequence");
  o += fmt::format("kvtier_queue_length {}\n", s.queued);
  metric(o, "kvtier_active_sequences", "gauge", "requests in the running batch");
  o += fmt::format("kvtier_active_sequences {}\n", s.active);
  metric(o, "kvtier_max_sequences", "gauge", "sequences the KV cache holds");
  o += fmt::format("kvtier_max_sequences {}\n", s.max_seqs);
  metric(o, "kvtier_steps_total", "counter", "forward passes run");
  o += fmt::format("kvtier_steps_total {}\n", s.steps);
  metric(o, "kvtier_step_tokens_total", "counter", "tokens of all forward passes");
  o += fmt::format("kvtier_step_tokens_total {}\n", s.step_tokens);
  metric(o, "kvtier_step_seconds_total", "counter", "time spent in forward passes");
  o += fmt::format("kvtier_step_seconds_total {:.6f}\n", s.step_seconds);
  metric(o, "kvtier_kv_bytes", "gauge", "KV cache bytes reserved per memory tier");
  const char* tiers[] = {"device", "host", "disk"};
  for (int t = 0; t < 3; ++t)
    o += fmt::format("kvtier_kv_bytes{{tier=\"{}\"}} {}\n", tiers[t], s.kv_bytes[t]);
  metric(o, "kvtier_kv_moved_bytes_total", "counter", "KV bytes moved between the home tier and compute");
  o += fmt::format("kvtier_kv_moved_bytes_total{{direction=\"load\"}} {}\n", s.bytes_loaded);
  o += fmt::format("kvtier_kv_moved_bytes_total{{direction=\"store\"}} {}\n", s.bytes_stored);
  metric(o, "kvtier_kv_stall_seconds_total", "counter", "time the compute waited for KV transfers");
  o += fmt::format("kvtier_kv_stall_seconds_total {:.6f}\n", s.stall_seconds);
  return o;
}

}  // namespace kvtier::server
