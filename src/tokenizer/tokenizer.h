// kvtier's tokenizer: built from a GGUF file's tokenizer.ggml.* metadata alone, producing the
// token ids of the tokenizer the model was trained with.
//
//   gguf::File f(path);
//   tokenizer::Tokenizer tok(f);
//   std::vector<TokenId> ids = tok.encode("Hello", {.add_special = true, .parse_special = false});
//   std::string text = tok.decode(ids);            // or a StreamDecoder, token by token
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/special.h"
#include "tokenizer/vocab.h"

namespace kvtier::tokenizer {

struct EncodeOptions {
  bool add_special = true;     // BOS / EOS as the file's add_bos_token / add_eos_token say
  bool parse_special = false;  // recognise control tokens (<|im_start|>, <bos>) written in the text
};

struct DecodeOptions {
  bool render_special = true;  // write control tokens as their text (false: leave them out)
};

class Tokenizer {
 public:
  explicit Tokenizer(const gguf::File& file);
  explicit Tokenizer(Vocab vocab);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<TokenId> encode(std::string_view text, const EncodeOptions& opt = {}) const;

  // The bytes token `id` stands for in the output (may be part of a UTF-8 character). `first`: the
  // token starts the output (SentencePiece's added space prefix is dropped there).
  std::string piece(TokenId id, bool first = false, const DecodeOptions& opt = {}) const;
  // All pieces concatenated; ill-formed UTF-8 in the result is shown as U+FFFD.
  std::string decode(std::span<const TokenId> ids, const DecodeOptions& opt = {}) const;
  // As decode, but the raw bytes (no U+FFFD replacement).
  std::string decode_bytes(std::span<const TokenId> ids, const DecodeOptions& opt = {}) const;

  const Vocab& vocab() const { return vocab_; }
  size_t n_vocab() const { return vocab_.size(); }
  // End of generation: EOS, EOT, EOM.
  bool is_end_of_generation(TokenId id) const;
  bool is_control(TokenId id) const;
  // Checks an id from outside (a flag, a request); throws Error(kInvalidArgument).
  void check_id(TokenId id) const;

 private:
  Vocab vocab_;
  std::unique_ptr<PreTokenizerRegex> pre_;  // byte-level only
  std::unique_ptr<AddedTokenMatcher> added_;
};

}  // namespace kvtier::tokenizer
