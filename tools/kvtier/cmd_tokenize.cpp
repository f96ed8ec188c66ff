// kvtier tokenize -m MODEL (-p TEXT | -f FILE) [--json] [--special] [--chat] [--bench]
// kvtier detokenize -m MODEL --ids 1,2,3
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "gguf/reader.h"
#include "run_common.h"
#include "token_ids.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvtier::cli {
namespace {

using tokenizer::TokenId;
using Clock = std::chrono::steady_clock;

struct TokenizeArgs {
  std::string model;
  std::string prompt;
  std::string file;
  bool json = false;
  bool special = false;
  bool no_add_special = false;
  bool ids_only = false;
  bool jsonl = false;
  bool chat = false;
  std::string chat_template;
  std::string system;
  bool bench = false;
  int repeat = 5;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int run_bench(const TokenizeArgs& a, const std::string& text, double load_s, const tokenizer::Tokenizer& tok,
              const tokenizer::EncodeOptions& opt) {
  std::vector<double> times;
  size_t n_tokens = 0;
  for (int r = 0; r < std::max(1, a.repeat); ++r) {
    const auto t0 = Clock::now();
    n_tokens = tok.encode(text, opt).size();
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  const double mb = static_cast<double>(text.size()) / 1e6;
  nlohmann::json j = {
      {"model", a.model}, {"bytes", text.size()},   {"tokens", n_tokens},   {"repeat", times.size()},
      {"median_s", med},  {"min_s", times.front()}, {"mb_per_s", mb / med}, {"tokens_per_s", n_tokens / med},
      {"load_s", load_s}};
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << fmt::format(
        "{}: {:.2f} MB, {} tokens, median {:.3f} s of {} -> {:.1f} MB/s, {:.2f} M tokens/s "
        "(tokenizer load {:.3f} s)\n",
        a.model, mb, n_tokens, med, times.size(), mb / med, n_tokens / med / 1e6, load_s);
  }
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  if (a.prompt.empty() == a.file.empty() && !(a.chat && !a.prompt.empty()))
    fail(ErrorKind::kInvalidArgument, "give exactly one of -p TEXT and -f FILE");
  const auto t0 = Clock::now();
  const gguf::File file(a.model);
  const tokenizer::Tokenizer tok(file);
  const double load_s = seconds_since(t0);
  tokenizer::EncodeOptions opt{.add_special = !a.no_add_special, .parse_special = a.special};
  std::string text = a.file.empty() ? a.prompt : read_text_file(a.file);

  if (a.jsonl) {  // one JSON string per input line -> one JSON object per output line
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const auto s = nlohmann::json::parse(line).get<std::string>();
      const std::vector<TokenId> ids = tok.encode(s, opt);
      std::string streamed;
      tokenizer::StreamDecoder dec(tok);
      for (TokenId id : ids) streamed += dec.push(id);
      streamed += dec.flush();
      const std::string decoded = tok.decode(ids);
      nlohmann::json j = {{"ids", ids}, {"decoded", decoded}, {"stream_matches", streamed == decoded}};
      std::cout << j.dump(-1, ' ', true) << "\n";  // ASCII: U+2028 must not break the line
    }
    return 0;
  }
  if (a.chat) {
    const auto& v = tok.vocab();
    const auto tmpl = tokenizer::chat_template_for(
        v, a.chat_template.empty() ? std::nullopt : std::optional<std::string_view>(a.chat_template));
    std::vector<tokenizer::ChatMessage> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system});
    msgs.push_back({"user", text});
    const std::string bos = v.special.bos != tokenizer::kNoToken ? v.text[v.special.bos] : "";
    const std::string eos = v.special.eos != tokenizer::kNoToken ? v.text[v.special.eos] : "";
    text = tokenizer::format_chat(tmpl, msgs, true, bos, eos);
    opt.parse_special = true;
    opt.add_special = !a.no_add_special && !tokenizer::template_writes_bos(tmpl);
  }
  if (a.bench) return run_bench(a, text, load_s, tok, opt);

  const std::vector<TokenId> ids = tok.encode(text, opt);
  if (a.json) {
    nlohmann::json pieces = nlohmann::json::array();
    for (TokenId id : ids) pieces.push_back(tokenizer::utf8_sanitize(tok.piece(id)));
    nlohmann::json j = {{"ids", ids}, {"pieces", pieces}, {"n_tokens", ids.size()}};
    if (a.chat) j["text"] = tokenizer::utf8_sanitize(text);
    std::cout << j.dump() << "\n";
  } else if (a.ids_only) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
    std::cout << s << "\n";
  } else {
    for (TokenId id : ids) {
      std::cout << fmt::format("{:>7} {}\n", id,
                               nlohmann::json(tokenizer::utf8_sanitize(tok.piece(id))).dump());
    }
  }
  return 0;
}

struct DetokenizeArgs {
  std::string model;
  std::string ids;
  bool no_special = false;
};

int run_detokenize(const DetokenizeArgs& a) {
  const gguf::File file(a.model);
  const tokenizer::Tokenizer tok(file);
  const std::vector<TokenId> ids = parse_token_ids(tok, a.ids);
  // Streamed token by token, as generation prints it.
  tokenizer::StreamDecoder dec(tok, {.render_special = !a.no_special});
  for (TokenId id : ids) std::cout << dec.push(id);
  std::cout << dec.flush() << std::flush;
  return 0;
}

}  // namespace

void add_tokenize(CLI::App& app, Runner& run) {
  auto a = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand("tokenize", "Tokenize text with a GGUF model's tokenizer");
  cmd->add_option("-m,--model", a->model, "GGUF file")->required();
  cmd->add_option("-p,--prompt", a->prompt, "Text to tokenize");
  cmd->add_option("-f,--file", a->file, "File whose contents to tokenize");
  cmd->add_flag("--json", a->json, "Print JSON: ids, pieces");
  cmd->add_flag("--ids", a->ids_only, "Print the ids only, comma-separated");
  cmd->add_flag("--special", a->special,
                "Recognise control tokens written in the text (<|im_start|>, <bos>)");
  cmd->add_flag("--no-add-special", a->no_add_special, "Do not add BOS/EOS even where the model asks");
  cmd->add_flag("--jsonl", a->jsonl,
                "Input holds one JSON string per line; print {ids, decoded, stream_matches} per line");
  cmd->add_flag("--chat", a->chat, "Format the text as one user turn with the model's chat template first");
  cmd->add_option("--chat-template", a->chat_template,
                  "Chat template to use instead of the model's (" + tokenizer::chat_template_names() + ")");
  cmd->add_option("--system", a->system, "System prompt (with --chat)");
  cmd->add_flag("--bench", a->bench, "Measure tokenisation throughput (MB/s) instead of printing tokens");
  cmd->add_option("--repeat", a->repeat, "Repetitions for --bench (median is reported)")->check(positive());
  cmd->callback([a, &run] { run = [a] { return run_tokenize(*a); }; });

  auto d = std::make_shared<DetokenizeArgs>();
  auto* dc = app.add_subcommand("detokenize", "Turn token ids back into text with a GGUF model's tokenizer");
  dc->add_option("-m,--model", d->model, "GGUF file")->required();
  dc->add_option("--ids", d->ids, "Token ids, comma-separated")->required();
  dc->add_flag("--no-special", d->no_special, "Leave control tokens out of the text");
  dc->callback([d, &run] { run = [d] { return run_detokenize(*d); }; });
}

}  // namespace kvtier::cli
