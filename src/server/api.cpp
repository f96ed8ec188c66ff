#include "server/api.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace kvtier::server {
namespace {

using nlohmann::json;

constexpr size_t kMaxStop = 16;         // stop strings per request
constexpr size_t kMaxStopBytes = 1024;  // bytes per stop string
constexpr int64_t kMaxTokensLimit = int64_t{1} << 31;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw RequestError(400, param, message);
}

const char* type_name(const json& v) {
  return v.type_name();
}

double number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad(name, fmt::format("'{}' must be a number, not {}", name, type_name(v)));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad(name, fmt::format("'{}' must be between {} and {}", name, lo, hi));
  return d;
}

int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(name, fmt::format("'{}' must be an integer, not {}", name, type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    bad(name, fmt::format("'{}' must be between {} and {}", name, lo, hi));
  }
  const auto i = v.get<int64_t>();
  if (i < lo || i > hi) bad(name, fmt::format("'{}' must be between {} and {}", name, lo, hi));
  return i;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, fmt::format("'{}' must be true or false, not {}", name, type_name(v)));
  return v.get<bool>();
}

std::string string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, fmt::format("'{}' must be a string, not {}", name, type_name(v)));
  return v.get<std::string>();
}

std::vector<std::string> stop_list(const json& v) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > kMaxStop) bad("stop", fmt::format("'stop' may hold at most {} strings", kMaxStop));
    for (const auto& s : v) out.push_back(string(s, "stop"));
  } else {
    bad("stop", fmt::format("'stop' must be a string or an array of strings, not {}", type_name(v)));
  }
  for (const auto& s : out) {
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
    if (s.size() > kMaxStopBytes)
      bad("stop", fmt::format("'stop' strings may be at most {} bytes", kMaxStopBytes));
  }
  return out;
}

// The content of a chat message: a string, or an array of {"type": "text", "text": ...} parts.
std::string message_content(const json& v, size_t i) {
  const std::string name = fmt::format("messages[{}].content", i);
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(name, fmt::format("'{}' must be a string or an array of text parts", name));
  std::string out;
  for (const auto& part : v) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text")) {
      bad(name, fmt::format("'{}': only parts {{\"type\": \"text\", \"text\": ...}} are supported", name));
    }
    out += string(part["text"], name + ".text");
  }
  return out;
}

std::vector<tokenizer::ChatMessage> messages(const json& v) {
  if (!v.is_array() || v.empty()) bad("messages", "'messages' must be a non-empty array");
  std::vector<tokenizer::ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string name = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(name, fmt::format("'{}' must be an object", name));
    for (const auto& [key, val] : m.items()) {
      if (key != "role" && key != "content" && key != "name") {
        bad(name + "." + key, fmt::format("'{}' has an unknown field '{}'", name, key));
      }
    }
    if (!m.contains("role")) bad(name + ".role", fmt::format("'{}' needs a 'role'", name));
    const std::string role = string(m["role"], name + ".role");
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      bad(name + ".role",
          fmt::format("'{}.role' must be system, developer, user or assistant, not '{}'", name, role));
    }
    if (!m.contains("content")) bad(name + ".content", fmt::format("'{}' needs a 'content'", name));
    out.push_back({role == "developer" ? "system" : role, message_content(m["content"], i)});
  }
  return out;
}

}  // namespace

json error_body(int status, const std::string& message, const std::string& param) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"message", message}, {"type", type}, {"code", status}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return {{"error", e}};
}

ApiRequest parse_request(Endpoint endpoint, const std::string& body, const std::string& served_model) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::parse_error& e) {
    bad("", fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) bad("", fmt::format("the body must be a JSON object, not {}", type_name(j)));
  ApiRequest r;
  r.endpoint = endpoint;
  r.sampling.temperature = 1.0f;
  r.sampling.penalty_last_n = 64;
  const bool chat = endpoint == Endpoint::kChat;
  for (const auto& [key, v] : j.items()) {
    if (key == "model") {
      r.model = string(v, key);
    } else if (key == "prompt" && !chat) {
      if (v.is_string()) {
        r.prompt_text = v.get<std::string>();
      } else if (v.is_array() && v.size() == 1 && v[0].is_string()) {
        r.prompt_text = v[0].get<std::string>();
      } else if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
        r.prompt_is_ids = true;
        for (const auto& id : v)
          r.prompt_ids.push_back(static_cast<int32_t>(integer(id, "prompt", 0, INT32_MAX)));
      } else {
        bad("prompt", "'prompt' must be a string, an array of one string or an array of token ids");
      }
    } else if (key == "messages" && chat) {
      r.messages = messages(v);
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      if (!v.is_null()) r.max_tokens = integer(v, key, 1, kMaxTokensLimit);
    } else if (key == "temperature") {
      if (!v.is_null()) r.sampling.temperature = static_cast<float>(number(v, key, 0, 2));
    } else if (key == "top_p") {
      if (!v.is_null()) {
        r.sampling.top_p = static_cast<float>(number(v, key, 0, 1));
        if (r.sampling.top_p <= 0.0f) bad(key, "'top_p' must be greater than 0 (and at most 1)");
      }
    } else if (key == "top_k") {
      if (!v.is_null()) r.sampling.top_k = static_cast<int>(integer(v, key, 0, 1 << 20));
    } else if (key == "min_p") {
      if (!v.is_null()) r.sampling.min_p = static_cast<float>(number(v, key, 0, 1));
    } else if (key == "presence_penalty") {
      if (!v.is_null()) r.sampling.presence_penalty = static_cast<float>(number(v, key, -2, 2));
    } else if (key == "frequency_penalty") {
      if (!v.is_null()) r.sampling.frequency_penalty = static_cast<float>(number(v, key, -2, 2));
    } else if (key == "repetition_penalty") {
      if (!v.is_null()) r.sampling.repeat_penalty = static_cast<float>(number(v, key, 0.01, 10));
    } else if (key == "seed") {
      if (!v.is_null()) {
        r.sampling.seed = static_cast<uint64_t>(
            integer(v, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
        r.seeded = true;
      }
    } else if (key == "stop") {
      r.stop = stop_list(v);
    } else if (key == "stream") {
      if (!v.is_null()) r.stream = boolean(v, key);
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) bad(key, "'stream_options' must be an object");
      for (const auto& [k2, v2] : v.items()) {
        if (k2 != "include_usage")
          bad("stream_options." + k2, fmt::format("'stream_options' has no field '{}'", k2));
        r.include_usage = boolean(v2, "stream_options.include_usage");
      }
    } else if (key == "echo" && !chat) {
      if (!v.is_null()) r.echo = boolean(v, key);
    } else if (key == "n") {
      if (!v.is_null() && integer(v, key, 1, 1) != 1) bad(key, "'n' must be 1");
    } else if (key == "user") {
      if (!v.is_null()) string(v, key);
    } else if (key == "logprobs" || key == "top_logprobs" || key == "logit_bias" || key == "best_of" ||
               key == "suffix" || key == "tools" || key == "tool_choice" || key == "response_format" ||
               key == "functions" || key == "function_call" || key == "parallel_tool_calls") {
      const bool is_default = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                              (key == "best_of" && v.is_number_integer() && v.get<int64_t>() == 1) ||
                              (v.is_object() && v.empty()) || (v.is_array() && v.empty());
      if (!is_default) throw RequestError(400, key, fmt::format("'{}' is not supported by kvtier", key));
    } else {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!j.contains("model")) bad("model", "'model' is required");
  if (r.model != served_model) {
    throw RequestError(
        404, "model",
        fmt::format("the model '{}' does not exist; this server serves '{}'", r.model, served_model));
  }
  if (chat && r.messages.empty()) bad("messages", "'messages' is required");
  if (!chat && !j.contains("prompt")) bad("prompt", "'prompt' is required");
  if (!chat && !r.prompt_is_ids && r.prompt_text.empty()) bad("prompt", "'prompt' is empty");
  if (r.echo && r.stream) bad("echo", "'echo' with 'stream' is not supported");
  return r;
}

}  // namespace kvtier::server
