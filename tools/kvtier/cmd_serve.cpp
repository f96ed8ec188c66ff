// kvtier serve -m MODEL [--host 127.0.0.1] [--port 8080] [--api-key K] [--max-seqs 8] [--max-queue 64]
//              [--kv-policy ...] [engine flags]
// An OpenAI-compatible HTTP server with continuous batching (src/server). Prints
// "kvtier: serving MODEL_ID on http://HOST:PORT" on stderr once it listens (--port 0: any free port);
// stops on Ctrl-C / SIGTERM.
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "core/error.h"
#include "run_common.h"
#include "server/http_server.h"
#include "server/scheduler.h"

namespace kvtier::cli {
namespace {

struct ServeArgs {
  EngineArgs engine;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  uint32_t max_seqs = 8;
  size_t max_queue = 64;
  std::string model_name;
  std::string chat_template;
  int read_timeout_s = 10;
};

int run_serve(const ServeArgs& a) {
  if (a.engine.backend == Backend::kCuda) {
    fail(ErrorKind::kUnsupported,
         "kvtier serve runs on the CPU backend (the CUDA forward pass is one sequence)");
  }
  const auto model = runtime::load_model(a.engine.model, load_options(a.engine));
  runtime::SessionOptions o = session_options(a.engine, model->config, 4096);
  o.kv_placement.max_seqs = a.max_seqs;
  runtime::Session session(*model, o);
  server::Scheduler scheduler(session, {a.max_queue});
  server::ServerOptions so;
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.model_name = a.model_name.empty() ? std::filesystem::path(a.engine.model).stem().string() : a.model_name;
  if (!a.chat_template.empty()) so.chat_template = tokenizer::parse_chat_template(a.chat_template);
  so.read_timeout_s = a.read_timeout_s;
  so.http_threads = a.max_seqs + a.max_queue + 8;
  server::HttpServer http(session, scheduler, so);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is an error on write, not a signal
  const int port = http.bind();
  std::thread listener([&] { http.listen(); });
  std::fprintf(stderr,
               "kvtier: serving %s on http://%s:%d (%u sequences, %lld-token context each, chunk %lld)\n",
               so.model_name.c_str(), a.host.c_str(), port, session.max_sequences(),
               static_cast<long long>(session.n_ctx()), static_cast<long long>(session.chunk()));
  while (!interrupted()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http.stop();
  listener.join();
  scheduler.stop();
  std::fprintf(stderr, "kvtier: server stopped\n");
  return 0;
}

}  // namespace

void add_serve(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server (completions, chat, streaming) with continuous batching");
  add_engine_flags(cmd, a->engine);
  cmd->add_option("--host", a->host, "address to listen on (loopback by default; 0.0.0.0 exposes it)")
      ->capture_default_str();
  cmd->add_option("--port", a->port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' on every request (else 401)");
  cmd->add_option("--max-seqs", a->max_seqs,
                  "sequences generated together (the running batch); each holds --ctx")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  cmd->add_option("--max-queue", a->max_queue, "requests that may wait for a sequence; more get HTTP 429")
      ->capture_default_str();
  cmd->add_option("--model-name", a->model_name, "the model id clients send (default: the file name's stem)");
  cmd->add_option("--chat-template", a->chat_template, "chat template name (default: the model file's)");
  cmd->add_option("--read-timeout", a->read_timeout_s,
                  "seconds a client may stay silent before or inside a request (an idle kept-alive "
                  "connection is closed after it)")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->callback([&run, a] { run = [a] { return run_serve(*a); }; });
}

}  // namespace kvtier::cli
