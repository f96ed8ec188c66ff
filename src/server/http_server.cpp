#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <ctime>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/api.h"
#include "server/metrics.h"

namespace kvtier::server {

using nlohmann::json;
using namespace std::chrono_literals;

struct HttpServer::Counters {
  std::mutex mu;
  std::map<int, uint64_t> by_status;  // responses by HTTP status
  std::atomic<uint64_t> next_id{1};
};

namespace {

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = {}) {
  res.status = status;
  res.set_content(dump(error_body(status, message, param)), "application/json");
}

// Constant-time comparison of the presented key.
bool same_key(const std::string& a, const std::string& b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

int64_t unix_time() {
  return static_cast<int64_t>(std::time(nullptr));
}

// What a request becomes once parsed and tokenised.
struct Job {
  ApiRequest api;
  GenRequest gen;
  std::string id;
  int64_t created = 0;
};

json usage_json(const GenEvent& ev) {
  return {{"prompt_tokens", ev.n_prompt},
          {"completion_tokens", ev.n_gen},
          {"total_tokens", ev.n_prompt + ev.n_gen},
          {"prompt_tokens_details", {{"cached_tokens", ev.n_reused}}}};
}

json chunk_json(const Job& j, const std::string& model, const std::string& text, const char* finish,
                bool first) {
  json choice = {{"index", 0}};
  choice["finish_reason"] = finish != nullptr ? json(finish) : json(nullptr);
  if (j.api.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || finish == nullptr) delta["content"] = text;
    choice["delta"] = delta;
    return {{"id", j.id},
            {"object", "chat.completion.chunk"},
            {"created", j.created},
            {"model", model},
            {"choices", json::array({choice})}};
  }
  choice["text"] = text;
  choice["logprobs"] = nullptr;
  return {{"id", j.id},
          {"object", "text_completion"},
          {"created", j.created},
          {"model", model},
          {"choices", json::array({choice})}};
}

json final_json(const Job& j, const std::string& model, const std::string& text, const GenEvent& ev,
                const std::string& prompt_text) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason_name(ev.reason)}};
  if (j.api.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    return {{"id", j.id},     {"object", "chat.completion"},      {"created", j.created},
            {"model", model}, {"choices", json::array({choice})}, {"usage", usage_json(ev)}};
  }
  choice["text"] = j.api.echo ? prompt_text + text : text;
  choice["logprobs"] = nullptr;
  return {{"id", j.id},     {"object", "text_completion"},      {"created", j.created},
          {"model", model}, {"choices", json::array({choice})}, {"usage", usage_json(ev)}};
}

}  // namespace

HttpServer::HttpServer(runtime::Session& session, Scheduler& scheduler, ServerOptions opt)
    : session_(session),
      scheduler_(scheduler),
      opt_(std::move(opt)),
      template_(opt_.chat_template ? *opt_.chat_template
                                   : tokenizer::chat_template_for(session.model().tokenizer->vocab())),
      http_(std::make_unique<httplib::Server>()),
      counters_(std::make_unique<Counters>()) {
  routes();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host) : opt_.port;
  if (opt_.port != 0 && !http_->bind_to_port(opt_.host, opt_.port)) {
    fail(ErrorKind::kIo, "cannot listen on {}:{} (in use, or not an address of this machine)", opt_.host,
         opt_.port);
  }
  if (port < 0) fail(ErrorKind::kIo, "cannot listen on {} (not an address of this machine?)", opt_.host);
  return port;
}

void HttpServer::listen() {
  http_->listen_after_bind();
}

void HttpServer::stop() {
  http_->stop();
}

void HttpServer::routes() {
  httplib::Server& s = *http_;
  const size_t threads = opt_.http_threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(opt_.max_body_bytes);
  s.set_read_timeout(opt_.read_timeout_s, 0);
  // cpp-httplib waits keep_alive_timeout for the first byte of every request, the first included (5 s
  // by default); the same silence is allowed before a request as inside one.
  s.set_keep_alive_timeout(opt_.read_timeout_s);
  s.set_write_timeout(opt_.write_timeout_s, 0);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opt_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 || !same_key(auth.substr(prefix.size()), opt_.api_key)) {
      send_error(res, 401, "a valid API key is required: send 'Authorization: Bearer KEY'");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 404   ? fmt::format("no route {} {}", req.method, req.path)
                            : res.status == 413 ? std::string("the request body is too large")
                            : res.status == 400 ? std::string("malformed HTTP request")
                                                : fmt::format("HTTP error {}", res.status);
    send_error(res, res.status, msg);
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, 500, msg);
  });
  s.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard lk(counters_->mu);
    ++counters_->by_status[res.status];
  });

  const std::string model = opt_.model_name;
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/v1/models", [model](const httplib::Request&, httplib::Response& res) {
    const json m = {{"id", model}, {"object", "model"}, {"created", 0}, {"owned_by", "kvtier"}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::map<int, uint64_t> by_status;
    {
      std::lock_guard lk(counters_->mu);
      by_status = counters_->by_status;
    }
    res.set_content(prometheus_text(scheduler_.stats(), by_status), "text/plain; version=0.0.4");
  });

  auto generate = [this, model](Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    auto job = std::make_shared<Job>();
    std::string prompt_text;
    try {
      job->api = parse_request(endpoint, req.body, model);
      const auto& tok = *session_.model().tokenizer;
      if (endpoint == Endpoint::kChat) {
        const auto& v = tok.vocab();
        const std::string bos = v.special.bos != tokenizer::kNoToken ? v.text[v.special.bos] : "";
        const std::string eos = v.special.eos != tokenizer::kNoToken ? v.text[v.special.eos] : "";
        const std::string text = tokenizer::format_chat(template_, job->api.messages, true, bos, eos);
        job->gen.prompt = tok.encode(
            text, {.add_special = !tokenizer::template_writes_bos(template_), .parse_special = true});
      } else if (job->api.prompt_is_ids) {
        job->gen.prompt = job->api.prompt_ids;
        if (job->api.echo) prompt_text = tok.decode(job->gen.prompt);
      } else {
        job->gen.prompt = tok.encode(job->api.prompt_text);
        prompt_text = job->api.prompt_text;
      }
      const int64_t room = session_.n_ctx() - static_cast<int64_t>(job->gen.prompt.size());
      const int64_t dflt = endpoint == Endpoint::kChat ? room : 16;
      job->gen.max_tokens = std::min(job->api.max_tokens.value_or(dflt), std::max<int64_t>(room, 1));
      job->gen.sampling = job->api.sampling;
      if (!job->api.seeded) job->gen.sampling.seed = std::random_device{}();
      job->gen.stop = job->api.stop;
    } catch (const RequestError& e) {
      return send_error(res, e.status(), e.what(), e.param());
    } catch (const Error& e) {
      return send_error(res, 400, e.what());
    }
    job->id = fmt::format("{}-{}", endpoint == Endpoint::kChat ? "chatcmpl" : "cmpl", counters_->next_id++);
    job->created = unix_time();
    std::shared_ptr<RequestHandle> h;
    try {
      h = scheduler_.submit(job->gen);
    } catch (const QueueFull& e) {
      res.set_header("Retry-After", "1");
      return send_error(res, 429, e.what());
    } catch (const Error& e) {
      return send_error(res, 400, e.what(), "prompt");
    }

    if (job->api.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [h, job, model](size_t, httplib::DataSink& sink) {
            auto send = [&](const std::string& data) {
              const std::string frame = "data: " + data + "\n\n";
              return sink.write(frame.data(), frame.size());
            };
            bool first = true;
            auto idle = std::chrono::steady_clock::now();
            for (;;) {
              GenEvent ev;
              if (!h->next(ev, 200ms)) {
                if (std::chrono::steady_clock::now() - idle > 1s) {  // keep-alive: notices a closed client
                  const std::string ping = ": keep-alive\n\n";
                  if (!sink.write(ping.data(), ping.size())) {
                    h->cancel();
                    return false;
                  }
                  idle = std::chrono::steady_clock::now();
                }
                continue;
              }
              idle = std::chrono::steady_clock::now();
              if (ev.done && ev.reason == FinishReason::kError) {
                send(dump(error_body(500, ev.error)));
                send("[DONE]");
                sink.done();
                return true;
              }
              if (!ev.text.empty() || first) {
                if (!send(dump(chunk_json(*job, model, ev.text, nullptr, first)))) {
                  h->cancel();
                  return false;
                }
                first = false;
              }
              if (ev.done) {
                send(dump(chunk_json(*job, model, "", finish_reason_name(ev.reason), false)));
                if (job->api.include_usage) {
                  json u = chunk_json(*job, model, "", nullptr, false);
                  u["choices"] = json::array();
                  u["usage"] = usage_json(ev);
                  send(dump(u));
                }
                send("[DONE]");
                sink.done();
                return true;
              }
            }
          },
          [h](bool) { h->cancel(); });  // no-op once finished; frees the sequence if the client left
      return;
    }

    // Not streamed: wait for the whole text. A short request answers with a plain response; a long
    // one switches to a chunked reply that writes a space now and then (noticing a closed client).
    auto text = std::make_shared<std::string>();
    auto wait_done = [h, text](std::chrono::milliseconds budget, GenEvent& last) {
      const auto until = std::chrono::steady_clock::now() + budget;
      while (std::chrono::steady_clock::now() < until) {
        GenEvent ev;
        if (!h->next(ev, 100ms)) continue;
        *text += ev.text;
        if (ev.done) {
          last = std::move(ev);
          return true;
        }
      }
      return false;
    };
    GenEvent last;
    auto respond = [job, model, text, prompt_text](const GenEvent& ev) {
      if (ev.reason == FinishReason::kError) return std::make_pair(500, dump(error_body(500, ev.error)));
      return std::make_pair(200, dump(final_json(*job, model, *text, ev, prompt_text)));
    };
    if (wait_done(1000ms, last)) {
      const auto [status, body] = respond(last);
      res.status = status;
      res.set_content(body, "application/json");
      return;
    }
    res.set_chunked_content_provider(
        "application/json",
        [h, wait_done, respond](size_t, httplib::DataSink& sink) {
          for (;;) {
            GenEvent ev;
            if (wait_done(1000ms, ev)) {
              const std::string body = respond(ev).second;
              sink.write(body.data(), body.size());
              sink.done();
              return true;
            }
            if (!sink.write(" ", 1)) {
              h->cancel();
              return false;
            }
          }
        },
        [h](bool) { h->cancel(); });
  };
  s.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kCompletions, req, res);
  });
  s.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) {
    generate(Endpoint::kChat, req, res);
  });
}

}  // namespace kvtier::server
