// The BPE merge loop shared by both encoders, as HF tokenizers' BPE::merge_word runs it: a heap of
// candidate pairs, lowest rank first and leftmost on ties; a popped pair is applied only if the
// two symbols are still neighbours that merge into the same token.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

#include "tokenizer/types.h"

namespace kvtier::tokenizer {

struct Symbol {
  TokenId id = kNoToken;
  int32_t prev = -1;
  int32_t next = -1;
  uint32_t begin = 0;     // bytes [begin, begin + len) of the text being encoded
  uint32_t len = 0;       // 0: absorbed into its left neighbour
  uint32_t chars = 0;     // code points (merge ranks of SentencePiece vocabularies use them)
  bool mergeable = true;  // false for byte-fallback and unknown symbols
};

// rank(left, right, &key, &id) -> whether the pair merges; Key is ordered by operator<.
template <typename Key, typename RankFn>
void bpe_merge(std::vector<Symbol>& syms, RankFn&& rank) {
  struct Cand {
    Key key;
    int32_t pos;
    TokenId id;
  };
  auto worse = [](const Cand& a, const Cand& b) {
    if (a.key < b.key) return false;
    if (b.key < a.key) return true;
    return a.pos > b.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = syms[l].next;
    if (r < 0 || !syms[l].mergeable || !syms[r].mergeable) return;
    Cand c{Key{}, l, kNoToken};
    if (rank(syms[l], syms[r], c.key, c.id)) heap.push(c);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Symbol& l = syms[c.pos];
    if (l.len == 0 || l.next < 0) continue;
    Symbol& r = syms[l.next];
    Key key{};
    TokenId id = kNoToken;
    if (!rank(l, r, key, id) || id != c.id) continue;
    l.id = id;
    l.len += r.len;
    l.chars += r.chars;
    l.next = r.next;
    r.len = 0;
    if (l.next >= 0) syms[l.next].prev = c.pos;
    push(l.prev);
    push(c.pos);
  }
}

}  // namespace kvtier::tokenizer
