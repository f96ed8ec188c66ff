// InfiniGen's speculation kernels on the GPU (backend/cuda/spec.h) against the host:
//   - scores and the chosen rows against policy::speculate with the CPU's reference score loops, on
//     data whose sums are exact in any order (small integers, power-of-two scales): the same scores,
//     counts, n_sel, chosen and rows, bit for bit, for both group rules, ties included;
//   - the rule on given scores (many ties, negative values, a cap, alpha = +inf) against a sort;
//   - partial rows and queries against policy::partial_rows (within one f16 / f32 rounding);
//   - the gather from pinned host planes: the chosen rows' bytes, nothing past them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/spec_scores.h"
#include "backend/cuda/spec.h"
#include "core/half.h"
#include "gpu_test_util.h"
#include "policy/infinigen_select.h"
#include "skew/skew_math.h"

namespace kvtier::cuda::test {
namespace {

struct SpecCase {
  int64_t n_head, n_head_kv, T, k;
  float alpha;
  double budget;
  policy::InfinigenGroup group;
};

// The rule on device group scores gs ([hk][T], stride T): the chosen rows, counts, chosen count and n_sel.
struct DeviceChoice {
  std::vector<int32_t> idx, counts;  // [hk][T] (the first `chosen` of each head), [hk]
  int32_t chosen = 0, n_sel = 0;
};

DeviceChoice choose_on_device(const float* gs, int64_t hk, int64_t T, int64_t cap, float alpha) {
  DeviceBuffer<int32_t> d_idx(static_cast<size_t>(hk * T)), d_counts(static_cast<size_t>(hk)), d_one(2);
  d_idx.fill_bytes(0xff);
  SpecChooseArgs ca;
  ca.gs = gs;
  ca.gs_stride = T;
  ca.n_head_kv = hk;
  ca.n_rows = T;
  ca.cap = cap;
  ca.alpha = alpha;
  ca.idx = d_idx.get();
  ca.idx_stride = T;
  ca.counts = d_counts.get();
  ca.chosen = d_one.get();
  ca.n_sel = d_one.get() + 1;
  spec_choose_rows(ca, nullptr);
  DeviceChoice r;
  r.idx = d_idx.download();
  r.counts = d_counts.download();
  const auto one = d_one.download();
  r.chosen = one[0];
  r.n_sel = one[1];
  return r;
}

// The device pipeline (group scores, then the rule) on qp [H, k] and pk per KV head [T, k] (f16 bits).
struct DeviceSpec {
  std::vector<float> gs;  // [hk][T]
  std::vector<int32_t> counts, idx;
  int32_t chosen = 0, n_sel = 0;
};

DeviceSpec run_device(const SpecCase& c, const std::vector<float>& qp,
                      const std::vector<std::vector<uint16_t>>& pk, float scale, int64_t cap) {
  const int64_t ld = spec_row_stride(c.k);
  std::vector<uint16_t> pk_dev(static_cast<size_t>(c.n_head_kv * c.T * ld), 0x7e00);  // padding: NaN
  for (int64_t g = 0; g < c.n_head_kv; ++g)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < c.k; ++j) pk_dev[(g * c.T + t) * ld + j] = pk[g][t * c.k + j];
  DeviceBuffer<float> d_qp(qp);
  DeviceBuffer<uint16_t> d_pk(pk_dev);
  DeviceBuffer<float> d_gs(static_cast<size_t>(c.n_head_kv * c.T));
  DeviceBuffer<float> d_hs(static_cast<size_t>(c.n_head * c.T + c.n_head));
  SpecScoresArgs sa;
  sa.qp = d_qp.get();
  sa.pk = d_pk.get();
  sa.pk_head_stride = c.T * ld;
  sa.ld = ld;
  sa.k = c.k;
  sa.n_head = c.n_head;
  sa.n_head_kv = c.n_head_kv;
  sa.n_rows = c.T;
  sa.scale = scale;
  sa.relative = c.group == policy::InfinigenGroup::kRelative;
  sa.gs = d_gs.get();
  sa.gs_stride = c.T;
  sa.head_scratch = d_hs.get();
  spec_group_scores(sa, nullptr);
  const DeviceChoice ch = choose_on_device(d_gs.get(), c.n_head_kv, c.T, cap, c.alpha);
  DeviceSpec r;
  r.gs = d_gs.download();
  r.counts = ch.counts;
  r.idx = ch.idx;
  r.chosen = ch.chosen;
  r.n_sel = ch.n_sel;
  return r;
}

TEST(CudaSpec, ScoresAndRowsMatchPolicySpeculateOnExactData) {
  KVTIER_REQUIRE_GPU();
  const SpecCase cases[] = {
      {8, 2, 1000, 38, 5.0f, 0.2, policy::InfinigenGroup::kRelative},
      {8, 2, 1000, 38, 5.0f, 0.2, policy::InfinigenGroup::kMax},
      {8, 8, 777, 12, INFINITY, 0.5, policy::InfinigenGroup::kRelative},
      {16, 2, 3000, 40, 2.0f, 0.05, policy::InfinigenGroup::kRelative},
      {4, 1, 50, 8, 5.0f, 1.0, policy::InfinigenGroup::kMax},  // T <= cap: every row
      {12, 4, 513, 19, 0.5f, 0.3, policy::InfinigenGroup::kRelative},
      {32, 32, 4100, 38, 5.0f, 0.2, policy::InfinigenGroup::kRelative},
  };
  std::mt19937 rng(7);
  for (const SpecCase& c : cases) {
    std::uniform_int_distribution<int> small(-3, 3), key(-4, 4);
    std::vector<float> qp(static_cast<size_t>(c.n_head * c.k));
    for (float& v : qp) v = 0.5f * static_cast<float>(small(rng));
    std::vector<std::vector<uint16_t>> pk(static_cast<size_t>(c.n_head_kv));
    for (auto& h : pk) {
      h.resize(static_cast<size_t>(c.T * c.k));
      for (uint16_t& v : h) v = f32_to_f16(static_cast<float>(key(rng)));
    }
    const float scale = 0.125f;
    const int64_t cap = policy::speculation_cap(c.budget, c.T);
    // The host: policy::speculate with the scalar reference loops.
    std::vector<const uint16_t*> pk_ptr;
    for (const auto& h : pk) pk_ptr.push_back(h.data());
    const int64_t n_tokens[1] = {c.T};
    const int64_t caps[1] = {cap};
    policy::SpecInput in;
    in.n_seq = 1;
    in.n_head = c.n_head;
    in.n_head_kv = c.n_head_kv;
    in.k_cols = c.k;
    in.scale = scale;
    in.qp = qp.data();
    in.pk = pk_ptr;
    in.n_tokens = n_tokens;
    in.cap = caps;
    in.group_scores = cpu::spec_scores_ref;
    in.head_scores = cpu::spec_head_scores_ref;
    in.group = c.group;
    policy::SpecResult ref;
    policy::speculate(in, c.alpha, ref);

    const DeviceSpec dev = run_device(c, qp, pk, scale, cap);
    const std::string what = "H " + std::to_string(c.n_head) + ", hk " + std::to_string(c.n_head_kv) +
                             ", T " + std::to_string(c.T) + ", group " +
                             std::string(policy::infinigen_group_name(c.group));
    ASSERT_EQ(dev.gs.size(), ref.scores.size()) << what;
    EXPECT_EQ(std::memcmp(dev.gs.data(), ref.scores.data(), dev.gs.size() * 4), 0)
        << what << ": scores differ";
    for (int64_t g = 0; g < c.n_head_kv; ++g) EXPECT_EQ(dev.counts[g], ref.count[g]) << what << " g " << g;
    EXPECT_EQ(dev.n_sel, ref.n_sel) << what;
    EXPECT_EQ(dev.chosen, ref.chosen[0]) << what;
    for (int64_t g = 0; g < c.n_head_kv; ++g) {
      const auto rows = ref.rows(0, g, c.n_head_kv);
      ASSERT_EQ(static_cast<int64_t>(rows.size()), dev.chosen) << what;
      const std::vector<int32_t> got(dev.idx.begin() + g * c.T, dev.idx.begin() + g * c.T + dev.chosen);
      EXPECT_EQ(got, std::vector<int32_t>(rows.begin(), rows.end())) << what << ": rows of KV head " << g;
    }
    std::fprintf(stderr, "[spec] %s: n_sel %d, chosen %d of %lld rows, same as policy::speculate\n",
                 what.c_str(), dev.n_sel, dev.chosen, static_cast<long long>(c.T));
  }
}

// The rule on given scores, against a sort (ties: the lower row first).
TEST(CudaSpec, ChosenRowsOfGivenScoresWithTies) {
  KVTIER_REQUIRE_GPU();
  struct Rule {
    int64_t hk, T, cap;
    float alpha;
    int levels;  // distinct score values (few: many ties)
  };
  const Rule rules[] = {{4, 5000, 1000, 3.0f, 7},   {2, 1, 1, 5.0f, 3},        {8, 300, 17, INFINITY, 4},
                        {1, 70000, 9000, 1.5f, 50}, {3, 2049, 2049, 0.25f, 2}, {5, 999, 100, 100.0f, 1000}};
  std::mt19937 rng(3);
  for (const Rule& r : rules) {
    std::uniform_int_distribution<int> lvl(0, r.levels - 1);
    std::vector<float> gs(static_cast<size_t>(r.hk * r.T));
    for (float& v : gs) v = 0.75f * static_cast<float>(lvl(rng)) - 2.0f;  // negative, zero and positive
    DeviceBuffer<float> d_gs(gs);
    const DeviceChoice ch = choose_on_device(d_gs.get(), r.hk, r.T, r.cap, r.alpha);
    const auto& idx = ch.idx;
    const auto& counts = ch.counts;
    const int32_t one[2] = {ch.chosen, ch.n_sel};
    int64_t sum = 0;
    for (int64_t g = 0; g < r.hk; ++g) {
      const float* s = gs.data() + g * r.T;
      const float m = *std::max_element(s, s + r.T);
      const auto c = std::count_if(s, s + r.T, [&](float v) { return v > m - r.alpha; });
      EXPECT_EQ(counts[g], c) << "g " << g;
      sum += c;
    }
    const int64_t n_sel = sum / r.hk;
    const int64_t chosen = r.T <= r.cap ? r.T : std::min(n_sel, r.cap);
    EXPECT_EQ(one[1], n_sel);
    ASSERT_EQ(one[0], chosen);
    for (int64_t g = 0; g < r.hk; ++g) {
      const float* s = gs.data() + g * r.T;
      std::vector<int32_t> order(static_cast<size_t>(r.T));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
      order.resize(static_cast<size_t>(chosen));
      std::sort(order.begin(), order.end());
      const std::vector<int32_t> got(idx.begin() + g * r.T, idx.begin() + g * r.T + chosen);
      EXPECT_EQ(got, order) << "T " << r.T << ", g " << g;
    }
  }
}

TEST(CudaSpec, PartialRowsAndQueriesMatchTheHost) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int64_t n = 37, hk = 4, G = 3, d = 64, k = 19, ld = spec_row_stride(k), stride = hk * d + 8;
  const auto x = random_floats(static_cast<size_t>(n * stride), rng);
  const auto b = random_floats(static_cast<size_t>(hk * d * k), rng, 0.2f);
  DeviceBuffer<float> d_x(x), d_b(b);
  const int64_t row0 = 5, rows = row0 + n;
  DeviceBuffer<uint16_t> d_pk(static_cast<size_t>(hk * rows * ld));
  d_pk.fill_bytes(0);
  spec_partial_rows(d_x.get(), stride, n, hk, d, d_b.get(), k, d_pk.get(), rows * ld, ld, row0, nullptr);
  const auto pk = d_pk.download();
  int max_ulp = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t g = 0; g < hk; ++g) {
      std::vector<float> ref(static_cast<size_t>(k));
      policy::partial_rows(x.data() + t * stride + g * d, 1, d, b.data() + g * d * k, k, ref.data());
      for (int64_t c = 0; c < ld; ++c) {
        const uint16_t got = pk[(g * rows + row0 + t) * ld + c];
        if (c >= k) {
          EXPECT_EQ(got, 0) << "padding";
          continue;
        }
        max_ulp = std::max(max_ulp, std::abs(static_cast<int>(got) - static_cast<int>(f32_to_f16(ref[c]))));
      }
    }
  }
  EXPECT_LE(max_ulp, 1) << "partial keys differ from f16(policy::partial_rows) by more than one half ulp";

  const auto q = random_floats(static_cast<size_t>(hk * G * d), rng);
  DeviceBuffer<float> d_q(q), d_qp(static_cast<size_t>(hk * G * k));
  spec_partial_query(d_q.get(), hk * G, G, d, d_b.get(), k, d_qp.get(), nullptr);
  const auto qp = d_qp.download();
  double worst = 0.0;
  for (int64_t j = 0; j < hk * G; ++j) {
    std::vector<float> ref(static_cast<size_t>(k));
    policy::partial_rows(q.data() + j * d, 1, d, b.data() + (j / G) * d * k, k, ref.data());
    for (int64_t c = 0; c < k; ++c)
      worst =
          std::max(worst, std::abs(static_cast<double>(qp[j * k + c]) - ref[c]) / (1.0 + std::abs(ref[c])));
  }
  EXPECT_LT(worst, 1e-5) << "partial queries";
  std::fprintf(stderr, "[spec] partial keys within %d half ulp, partial queries within %.2g\n", max_ulp,
               worst);
}

// The prompt's column scores (two passes added up) against skew::rotate_rows + add_abs_column_sums, and
// the rebuild of partial keys from f16 rows against policy::partial_rows on the widened values.
TEST(CudaSpec, ColumnScoresAndF16RowsMatchTheHost) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(13);
  const int64_t n = 70, hk = 2, G = 3, H = hk * G, d = 64, kstride = hk * d + 16;
  const auto q = random_floats(static_cast<size_t>(n * H * d), rng);
  const auto k = random_floats(static_cast<size_t>(n * kstride), rng);
  const auto a = random_floats(static_cast<size_t>(hk * d * d), rng, 0.125f);
  std::vector<double> ref(static_cast<size_t>(hk * d), 0.0);
  std::vector<float> rot(static_cast<size_t>(d));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < H; ++j) {
      skew::rotate_rows(q.data() + (t * H + j) * d, 1, d, a.data() + (j / G) * d * d, rot.data());
      skew::add_abs_column_sums(rot.data(), 1, d, ref.data() + (j / G) * d);
    }
    for (int64_t g = 0; g < hk; ++g) {
      skew::rotate_rows(k.data() + t * kstride + g * d, 1, d, a.data() + g * d * d, rot.data());
      skew::add_abs_column_sums(rot.data(), 1, d, ref.data() + g * d);
    }
  }
  DeviceBuffer<float> d_q(q), d_k(k), d_a(a);
  DeviceBuffer<double> d_score(std::vector<double>(static_cast<size_t>(hk * d), 0.0));
  const int64_t first = 33;  // two passes: tokens [0, 33) and [33, 70)
  spec_column_scores(d_q.get(), H, d_k.get(), kstride, first, hk, d, d_a.get(), d_score.get(), nullptr);
  spec_column_scores(d_q.get() + first * H * d, H, d_k.get() + first * kstride, kstride, n - first, hk, d,
                     d_a.get(), d_score.get(), nullptr);
  const auto got = d_score.download();
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - ref[i]) / ref[i]);
  EXPECT_LT(worst, 1e-5) << "column scores";

  // f16 rows: head g's rows at x + g * head_stride (a K plane of the host layout, V plane between).
  const int64_t k_cols = 19, ld = spec_row_stride(k_cols), head_stride = 2 * n * d;
  std::vector<uint16_t> rows(static_cast<size_t>(hk * head_stride));
  for (auto& v : rows) v = f32_to_f16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
  const auto b = random_floats(static_cast<size_t>(hk * d * k_cols), rng, 0.2f);
  DeviceBuffer<uint16_t> d_rows(rows), d_pk(static_cast<size_t>(hk * n * ld));
  DeviceBuffer<float> d_b(b);
  spec_partial_rows_f16(d_rows.get(), head_stride, n, hk, d, d_b.get(), k_cols, d_pk.get(), n * ld, ld, 0,
                        nullptr);
  const auto pk = d_pk.download();
  // Both sums are f32 over d products in different orders (the device fuses multiply-adds): each is within
  // d * 2^-24 * sum |x_i b_i| of the exact sum, so a small result may be a few half ulps off once rounded
  // to f16 (seen: 3 on an H200). Allowed: one f16 ulp of the host's value (rounding, also across a binade
  // edge) plus twice that bound; max_ulp is reported.
  int max_ulp = 0, beyond = 0;
  for (int64_t g = 0; g < hk; ++g) {
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> x(static_cast<size_t>(d)), r(static_cast<size_t>(k_cols));
      for (int64_t i = 0; i < d; ++i) x[i] = f16_to_f32(rows[g * head_stride + t * d + i]);
      policy::partial_rows(x.data(), 1, d, b.data() + g * d * k_cols, k_cols, r.data());
      for (int64_t c = 0; c < k_cols; ++c) {
        const uint16_t got = pk[(g * n + t) * ld + c];
        max_ulp = std::max(max_ulp, std::abs(static_cast<int>(got) - static_cast<int>(f32_to_f16(r[c]))));
        double mag = 0.0;
        for (int64_t i = 0; i < d; ++i)
          mag += std::abs(static_cast<double>(x[i]) * b[(g * d + i) * k_cols + c]);
        const double ulp = std::ldexp(1.0, std::max(std::ilogb(std::max(std::abs(r[c]), 6.1e-5f)), -14) - 10);
        beyond +=
            std::abs(static_cast<double>(f16_to_f32(got)) - r[c]) > ulp + 2.0 * d * std::ldexp(mag, -24);
      }
    }
  }
  EXPECT_EQ(beyond, 0) << "partial keys of f16 rows beyond f16 rounding plus the f32 summation bound";
  std::fprintf(stderr,
               "[spec] column scores within %.2g (relative), partial keys of f16 rows within %d half ulp\n",
               worst, max_ulp);
}

TEST(CudaSpec, GatherCopiesTheChosenRowsFromPinnedHostPlanes) {
  KVTIER_REQUIRE_GPU();
  const int64_t hk = 3, P = 500, row_bytes = 128, cap = 96, stride = 200;
  const size_t plane = static_cast<size_t>(P * row_bytes), dplane = static_cast<size_t>(cap * row_bytes);
  uint8_t* host = nullptr;
  KVTIER_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), 2 * hk * plane,
                                  cudaHostAllocPortable | cudaHostAllocMapped));
  std::mt19937 rng(9);
  for (size_t i = 0; i < 2 * hk * plane; ++i) host[i] = static_cast<uint8_t>(rng());
  const int32_t chosen = 70;
  std::vector<int32_t> idx(static_cast<size_t>(hk * stride), -1);
  for (int64_t g = 0; g < hk; ++g)
    for (int32_t i = 0; i < chosen; ++i) idx[g * stride + i] = static_cast<int32_t>((i * 7 + g) % P);
  DeviceBuffer<int32_t> d_idx(idx), d_chosen(std::vector<int32_t>{chosen});
  void* dev = nullptr;
  KVTIER_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
  // Both kernel shapes; the persistent one also with too few blocks for one pass over the rows.
  const std::pair<GatherKernel, int> shapes[] = {
      {GatherKernel::kFlat, 0}, {GatherKernel::kPersistent, 132}, {GatherKernel::kPersistent, 3}};
  for (const auto& [kernel, blocks] : shapes) {
    DeviceBuffer<uint8_t> dst(2 * hk * dplane);
    dst.fill_bytes(0xab);
    spec_gather_rows(static_cast<const uint8_t*>(dev), plane, dst.get(), dplane, row_bytes, hk, d_idx.get(),
                     stride, d_chosen.get(), cap, nullptr, kernel, std::max(blocks, 1));
    const auto out = dst.download();
    int bad = 0;
    for (int64_t p = 0; p < 2 * hk; ++p) {
      for (int64_t i = 0; i < cap; ++i) {
        const uint8_t* got = out.data() + p * dplane + i * row_bytes;
        if (i < chosen) {
          const uint8_t* want = host + p * plane + idx[(p / 2) * stride + i] * row_bytes;
          bad += std::memcmp(got, want, row_bytes) != 0;
        } else {
          bad += !std::all_of(got, got + row_bytes, [](uint8_t v) { return v == 0xab; });
        }
      }
    }
    EXPECT_EQ(bad, 0) << (kernel == GatherKernel::kFlat ? "flat" : "persistent") << " gather, " << blocks
                      << " blocks: rows wrong or written past the chosen ones";
  }
  cudaFreeHost(host);
}

}  // namespace
}  // namespace kvtier::cuda::test
