// The OpenAI request bodies the server accepts, checked field by field: a body that is not a JSON
// object, a field of the wrong type, a value out of range or a field the API does not have is a
// RequestError (HTTP 400, or 404 for an unknown model) whose message names the field. Known OpenAI
// fields that kvtier does not implement are refused by name unless they hold their default value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "tokenizer/chat_template.h"

namespace kvtier::server {

class RequestError : public std::runtime_error {
 public:
  RequestError(int status, std::string param, const std::string& message)
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

enum class Endpoint { kCompletions, kChat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  std::string prompt_text;          // completions: the prompt as text
  std::vector<int32_t> prompt_ids;  // completions: the prompt as token ids (when given so)
  bool prompt_is_ids = false;
  std::vector<tokenizer::ChatMessage> messages;  // chat
  std::optional<int64_t> max_tokens;             // absent: 16 (completions) or the rest of the context (chat)
  runtime::SamplerParams sampling;               // temperature 1 and top_p 1 unless given (OpenAI's defaults)
  bool seeded = false;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions: the prompt text before the completion
};

// Parses a body for `endpoint`; `served_model` is the one model name this server answers to.
// Throws RequestError.
ApiRequest parse_request(Endpoint endpoint, const std::string& body, const std::string& served_model);

// {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {});

}  // namespace kvtier::server
