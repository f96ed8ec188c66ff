#include "eval/results.h"

#include <cmath>

namespace kvtier::eval {
namespace {

struct Acc {
  Cell cell;
  double sum = 0.0;
  double nll = 0.0;
  int64_t scored = 0;
};

}  // namespace

std::vector<Cell> Results::aggregate(bool by_length, bool by_depth) const {
  // Keys in first-seen order, so cells come out in the order samples were run (grid order).
  using Key = std::tuple<std::string, int, int64_t, int>;
  std::map<Key, size_t> index;
  std::vector<Acc> accs;
  for (const SampleResult& s : samples_) {
    if (by_depth && s.depth_index < 0) continue;
    const Key key{s.policy, static_cast<int>(s.task), by_length ? s.length : 0,
                  by_depth ? s.depth_index : -1};
    auto [it, inserted] = index.emplace(key, accs.size());
    if (inserted) {
      Acc a;
      a.cell = {s.policy,
                s.task,
                by_length ? s.length : 0,
                by_depth ? s.depth_index : -1,
                by_depth ? s.depth : -1.0,
                0,
                0.0};
      accs.push_back(a);
    }
    Acc& a = accs[it->second];
    ++a.cell.n;
    a.sum += s.score;
    a.nll += s.nll_sum;
    a.scored += s.n_scored;
  }
  std::vector<Cell> out;
  for (Acc& a : accs) {
    if (a.cell.task == TaskKind::kPpl) {
      a.cell.value = a.scored > 0 ? std::exp(a.nll / static_cast<double>(a.scored)) : NAN;
    } else {
      a.cell.value = a.sum / a.cell.n;
    }
    out.push_back(a.cell);
  }
  return out;
}

std::vector<Cell> Results::depth_cells() const {
  return aggregate(true, true);
}
std::vector<Cell> Results::length_cells() const {
  return aggregate(true, false);
}
std::vector<Cell> Results::overall() const {
  return aggregate(false, false);
}

std::vector<Mismatch> compare_policies(const Results& r, const std::string& reference,
                                       const std::string& other) {
  using Key = std::tuple<int, int64_t, int, int>;
  std::map<Key, const SampleResult*> ref;
  for (const auto& s : r.samples()) {
    if (s.policy == reference) ref[{static_cast<int>(s.task), s.length, s.depth_index, s.index}] = &s;
  }
  std::vector<Mismatch> out;
  for (const auto& s : r.samples()) {
    if (s.policy != other) continue;
    auto it = ref.find({static_cast<int>(s.task), s.length, s.depth_index, s.index});
    if (it == ref.end()) continue;
    const SampleResult& a = *it->second;
    if (a.answer != s.answer || a.score != s.score || a.nll_sum != s.nll_sum) {
      out.push_back({reference, other, s.task, s.length, s.depth, s.index, a.answer, s.answer});
    }
  }
  return out;
}

}  // namespace kvtier::eval
