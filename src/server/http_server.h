// The OpenAI-compatible HTTP front of a Scheduler (cpp-httplib): POST /v1/completions and
// /v1/chat/completions (plain JSON, or server-sent events with "stream": true), GET /v1/models,
// /health and /metrics (Prometheus text). Every error is a 4xx/5xx with an OpenAI-style JSON body.
// With an API key, a request without "Authorization: Bearer KEY" gets 401 (every path).
// A client that goes away is noticed on the next write (streamed pieces, or a keep-alive: an SSE
// comment, or a space before the JSON of a long non-streamed reply; JSON allows leading whitespace)
// and its request is cancelled, which frees its sequence at the next step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/session.h"
#include "server/scheduler.h"
#include "tokenizer/chat_template.h"

namespace httplib {
class Server;
}

namespace kvtier::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (bind() returns it)
  std::string api_key;
  std::string model_name;  // the id clients name in "model"
  std::optional<tokenizer::ChatTemplate> chat_template;
  size_t max_body_bytes = size_t{1} << 20;
  int read_timeout_s =
      10;  // a client that sends nothing for this long (before or inside a request) is dropped
  int write_timeout_s = 10;  // a client that reads nothing for this long is dropped
  size_t http_threads = 96;  // connections served at once (beyond: they wait for a thread)
};

class HttpServer {
 public:
  HttpServer(runtime::Session& session, Scheduler& scheduler, ServerOptions opt);
  ~HttpServer();

  // Binds the listening socket; returns the port. Throws Error(kIo) when it cannot.
  int bind();
  // Serves until stop() (from another thread or a signal handler's thread).
  void listen();
  void stop();

 private:
  struct Counters;
  void routes();

  runtime::Session& session_;
  Scheduler& scheduler_;
  ServerOptions opt_;
  tokenizer::ChatTemplate template_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Counters> counters_;
};

}  // namespace kvtier::server
