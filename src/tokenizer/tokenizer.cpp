#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "gguf/reader.h"
#include "tokenizer/encoders.h"
#include "tokenizer/utf8.h"

namespace kvtier::tokenizer {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

std::string spm_piece(const Vocab& v, TokenId id, bool first) {
  const std::string& t = v.text[id];
  if (v.type[id] == TokenType::kByte) {
    for (int b = 0; b < 256; ++b) {
      if (v.byte_token[b] == id) return std::string(1, static_cast<char>(b));
    }
  }
  std::string out;
  out.reserve(t.size());
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += t[i++];
    }
  }
  // Metaspace's decoder drops the space it prefixed.
  if (first && v.add_space_prefix && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace

Tokenizer::Tokenizer(const gguf::File& file) : Tokenizer(load_vocab(file)) {}

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  if (vocab_.kind == TokenizerKind::kByteLevelBpe) pre_ = std::make_unique<PreTokenizerRegex>(vocab_.pre);
  added_ = std::make_unique<AddedTokenMatcher>(vocab_);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (opt.add_special && vocab_.add_bos && vocab_.special.bos != kNoToken) out.push_back(vocab_.special.bos);
  std::vector<Fragment> frags;
  added_->partition(text, opt.parse_special, frags);
  for (const Fragment& f : frags) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      continue;
    }
    const std::string_view part = text.substr(f.begin, f.end - f.begin);
    if (vocab_.kind == TokenizerKind::kByteLevelBpe) {
      encode_byte_level(vocab_, *pre_, part, out);
    } else {
      encode_sentencepiece(vocab_, part, f.begin == 0, out);
    }
  }
  if (opt.add_special && vocab_.add_eos && vocab_.special.eos != kNoToken) out.push_back(vocab_.special.eos);
  return out;
}

void Tokenizer::check_id(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= vocab_.size())
    fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {} tokens", id,
         vocab_.size());
}

bool Tokenizer::is_control(TokenId id) const {
  const TokenType t = vocab_.type[id];
  return t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  const SpecialIds& s = vocab_.special;
  return id != kNoToken && (id == s.eos || id == s.eot || id == s.eom);
}

std::string Tokenizer::piece(TokenId id, bool first, const DecodeOptions& opt) const {
  check_id(id);
  if (is_control(id) && vocab_.type[id] != TokenType::kUnused) {
    return opt.render_special ? vocab_.text[id] : std::string();
  }
  if (vocab_.kind == TokenizerKind::kByteLevelBpe) return vocab_.text[id];
  return spm_piece(vocab_, id, first);
}

std::string Tokenizer::decode_bytes(std::span<const TokenId> ids, const DecodeOptions& opt) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += piece(ids[i], out.empty(), opt);
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& opt) const {
  return utf8_sanitize(decode_bytes(ids, opt));
}

}  // namespace kvtier::tokenizer
