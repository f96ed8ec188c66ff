#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenize.h"

#include <pcre2.h>

#include <string>

#include "core/error.h"

namespace kvtier::tokenizer {
namespace {

// The split patterns of the tokenizers the models were trained with (HF tokenizers' ByteLevel and
// the tokenizer.json files of Llama-3 and Qwen2).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

pcre2_code* compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \s, \d and \w use Unicode properties. MATCH_INVALID_UTF: ill-formed bytes never match
  // (they are left between matches) instead of failing the whole match.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
  KVTIER_ASSERT(code, "pre-tokeniser regex does not compile at {}: {}", offset, pcre2_message(err));
  const int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  KVTIER_ASSERT(jit == 0 || jit == PCRE2_ERROR_JIT_BADOPTION, "PCRE2 JIT failed: {}", pcre2_message(jit));
  return code;
}

}  // namespace

struct PreTokenizerRegex::Impl {
  pcre2_code* code = nullptr;
  pcre2_code* digits = nullptr;  // kSmollm: HF Digits(individual_digits) = every char::is_numeric() alone
  ~Impl() {
    pcre2_code_free(code);
    pcre2_code_free(digits);
  }
};

std::string_view pre_tokenizer_regex(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::kGpt2:
    case PreTokenizer::kSmollm:
      return kGpt2;
    case PreTokenizer::kLlama3:
      return kLlama3;
    case PreTokenizer::kQwen2:
      return kQwen2;
  }
  return kGpt2;
}

PreTokenizerRegex::PreTokenizerRegex(PreTokenizer kind) : kind_(kind), impl_(std::make_unique<Impl>()) {
  impl_->code = compile(pre_tokenizer_regex(kind));
  if (kind == PreTokenizer::kSmollm) impl_->digits = compile(R"(\p{N})");
}

PreTokenizerRegex::~PreTokenizerRegex() = default;

namespace {

// HF Split(behavior=Isolated): matches and the text between them are pieces.
void split_isolated(const pcre2_code* code, std::string_view text, size_t base, std::vector<Span>& out) {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  KVTIER_ASSERT(md, "out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    KVTIER_ASSERT(rc > 0, "PCRE2 match failed: {}", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s > pos) out.push_back({base + pos, base + s});
    if (e == s) {  // the patterns cannot match empty; guard against looping anyway
      pos = s + 1;
      continue;
    }
    out.push_back({base + s, base + e});
    pos = e;
  }
  if (pos < text.size()) out.push_back({base + pos, base + text.size()});
  pcre2_match_data_free(md);
}

}  // namespace

void PreTokenizerRegex::split(std::string_view text, std::vector<Span>& out) const {
  if (!impl_->digits) {
    split_isolated(impl_->code, text, 0, out);
    return;
  }
  // Digits first (each numeric character alone), then the GPT-2 pattern over the text between.
  std::vector<Span> stage;
  split_isolated(impl_->digits, text, 0, stage);
  for (const Span& s : stage)
    split_isolated(impl_->code, text.substr(s.begin, s.end - s.begin), s.begin, out);
}

}  // namespace kvtier::tokenizer
