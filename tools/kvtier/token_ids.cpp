#include "token_ids.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace kvtier::cli {

std::vector<tokenizer::TokenId> parse_token_ids(const tokenizer::Tokenizer& tok, std::string_view text) {
  std::vector<tokenizer::TokenId> ids;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item(text.substr(begin, comma - begin));
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || id < 0 || id > INT32_MAX)
      fail(ErrorKind::kInvalidArgument, "--ids: '{}' is not a token id (expected e.g. --ids 1,2,3)", item);
    tok.check_id(static_cast<tokenizer::TokenId>(id));
    ids.push_back(static_cast<tokenizer::TokenId>(id));
    begin = comma + 1;
  }
  return ids;
}

}  // namespace kvtier::cli
