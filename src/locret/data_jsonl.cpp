#include "locret/data_jsonl.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kvtier::locret {
namespace {

std::string field(const nlohmann::json& j, const char* key, const std::string& where, bool required) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) fail(ErrorKind::kInvalidFile, "{}: no \"{}\"", where, key);
    return {};
  }
  if (!it->is_string()) fail(ErrorKind::kInvalidFile, "{}: \"{}\" is not a string", where, key);
  return it->get<std::string>();
}

}  // namespace

std::vector<Sample> read_jsonl_samples(const std::string& path, const tokenizer::Tokenizer& tok,
                                       std::optional<tokenizer::ChatTemplate> tmpl, int64_t max_tokens,
                                       JsonlStats* stats) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kIo, "cannot open training data {}", path);
  const auto& v = tok.vocab();
  const std::string bos = v.special.bos != tokenizer::kNoToken ? v.text[v.special.bos] : "";
  const std::string eos = v.special.eos != tokenizer::kNoToken ? v.text[v.special.eos] : "";
  JsonlStats st;
  std::vector<Sample> out;
  std::string line;
  while (std::getline(in, line)) {
    ++st.lines;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", path, st.lines);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::kInvalidFile, "{}: not JSON ({})", where, e.what());
    }
    if (!j.is_object()) fail(ErrorKind::kInvalidFile, "{}: not a JSON object", where);
    const std::string prompt = field(j, "prompt", where, true);
    const std::string answer = field(j, "answer", where, true);
    const std::string system = field(j, "system", where, false);
    if (answer.empty()) fail(ErrorKind::kInvalidFile, "{}: empty answer", where);
    Sample s;
    if (tmpl) {
      std::vector<tokenizer::ChatMessage> msgs;
      if (!system.empty()) msgs.push_back({"system", system});
      msgs.push_back({"user", prompt});
      const std::string text = tokenizer::format_chat(*tmpl, msgs, true, bos, eos);
      s.tokens =
          tok.encode(text, {.add_special = !tokenizer::template_writes_bos(*tmpl), .parse_special = true});
      s.n_prompt = static_cast<int64_t>(s.tokens.size());
      const auto a = tok.encode(answer, {.add_special = false, .parse_special = false});
      s.tokens.insert(s.tokens.end(), a.begin(), a.end());
    } else {
      s.tokens = tok.encode((system.empty() ? "" : system + "\n\n") + prompt);
      s.n_prompt = static_cast<int64_t>(s.tokens.size());
      const auto a = tok.encode(" " + answer, {.add_special = false, .parse_special = false});
      s.tokens.insert(s.tokens.end(), a.begin(), a.end());
    }
    if (s.n_prompt < 1 || static_cast<int64_t>(s.tokens.size()) <= s.n_prompt) continue;
    if (static_cast<int64_t>(s.tokens.size()) > max_tokens) {
      ++st.too_long;
      continue;
    }
    ++st.kept;
    out.push_back(std::move(s));
  }
  if (stats) *stats = st;
  return out;
}

}  // namespace kvtier::locret
