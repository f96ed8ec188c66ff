// The memory model against the HeadInfer paper's Tables 10 and 11 (Llama-3-8B, bf16; the paper's
// "GB" are GiB and "K" tokens are 1024). Expected values are the paper's printed figures.
#include <gtest/gtest.h>

#include "core/error.h"
#include "policy/memory_model.h"

namespace kvtier::policy {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

ModelShape llama3_8b() {
  ModelShape m;
  m.n_layer = 32;
  m.n_embd = 4096;
  m.n_ff = 14336;
  m.n_head = 32;
  m.n_head_kv = 8;
  m.head_dim = 128;
  m.weight_bytes = 8030261248ull * 2;  // parameters x bf16
  return m;
}

double gib(uint64_t b) {
  return static_cast<double>(b) / kGiB;
}

void expect_within(double got, double paper, double rel, const char* what) {
  EXPECT_NEAR(got, paper, paper * rel) << what << ": model " << got << " vs paper " << paper;
}

TEST(MemoryModel, PaperTable10AtOneMillionTokens) {
  PlanInputs in;
  in.n_ctx = 1u << 20;
  in.chunk = 10240;
  in.group = 1;
  struct Row {
    Method m;
    double kv, act, total, total_kv;
  };
  const Row rows[] = {
      {Method::kStandard, 128, 64, 207, 128},    {Method::kChunked, 128, 0.625, 143, 128},
      {Method::kKvQuant4, 32, 64, 111, 32},      {Method::kLayer, 8, 64, 87, 128},
      {Method::kHeadInfer, 1, 0.625, 16.7, 128},
  };
  for (const auto& r : rows) {
    const MemoryPlan p = plan_memory(llama3_8b(), r.m, in);
    const auto name = std::string(method_name(r.m));
    expect_within(gib(p.device_weights), 15.08, 0.02, "weights");
    expect_within(gib(p.device_kv), r.kv, 0.02, (name + " kv").c_str());
    expect_within(gib(p.device_activations), r.act, 0.02, (name + " activations").c_str());
    expect_within(gib(p.device_total()), r.total, 0.02, (name + " total").c_str());
    expect_within(gib(p.total_kv), r.total_kv, 0.02, (name + " total kv").c_str());
  }
}

TEST(MemoryModel, PaperTable11InDeviceMaxima) {
  struct Row {
    Method m;
    uint64_t ctx;
    double kv, act, total, total_kv;
  };
  const Row rows[] = {
      {Method::kStandard, 25 * 1024, 3.13, 1.56, 19.77, 3.13},
      {Method::kChunked, 30 * 1024, 3.75, 0.63, 19.46, 3.75},
      {Method::kKvQuant4, 45 * 1024, 1.41, 2.81, 19.30, 1.41},
      {Method::kLayer, 45 * 1024, 0.35, 2.81, 18.25, 5.63},
      {Method::kHeadInfer, 4000 * 1024, 3.91, 0.63, 19.61, 500},
  };
  for (const auto& r : rows) {
    PlanInputs in;
    in.n_ctx = r.ctx;
    in.chunk = 10240;
    in.group = 1;
    const MemoryPlan p = plan_memory(llama3_8b(), r.m, in);
    const auto name = std::string(method_name(r.m));
    expect_within(gib(p.device_kv), r.kv, 0.02, (name + " kv").c_str());
    expect_within(gib(p.device_activations), r.act, 0.02, (name + " activations").c_str());
    expect_within(gib(p.device_total()), r.total, 0.02, (name + " total").c_str());
    expect_within(gib(p.total_kv), r.total_kv, 0.02, (name + " total kv").c_str());
  }
}

// HeadInfer spec 5: S_max ~ M_pp / (4 g d_h b); with the ping-pong room of the paper's card
// (M_pp ~ 4 GiB) the group sizes 8/4/2/1 reach ~512K/1M/2M/4M tokens (paper: 550K..4096K).
TEST(MemoryModel, MaxContextScalesInverselyWithGroup) {
  const ModelShape m = llama3_8b();
  PlanInputs in;
  in.chunk = 10240;
  const uint64_t fixed =
      plan_memory(m, Method::kHeadInfer, PlanInputs{.n_ctx = 10240, .group = 1}).device_weights +
      10240ull * (4096 + 2 * 14336) * 2;
  in.device_budget = fixed + (4ull << 30);
  for (uint32_t g : {8u, 4u, 2u, 1u}) {
    in.group = g;
    EXPECT_EQ(max_context(m, Method::kHeadInfer, in), (4ull << 30) / (4ull * g * 128 * 2)) << g;
  }
  in.group = 0;  // adaptive: the best group is the smallest
  EXPECT_EQ(max_context(m, Method::kHeadInfer, in), (4ull << 30) / (4ull * 1 * 128 * 2));
  // The host pool bounds it too: 512 GiB / 128 KiB per token = 4M tokens.
  in.host_budget = 512ull << 30;
  in.device_budget = 0;
  EXPECT_EQ(max_context(m, Method::kHeadInfer, in), 4ull << 20);
  // Budgets that cannot hold the weights give 0.
  in.device_budget = 1ull << 30;
  EXPECT_EQ(max_context(m, Method::kStandard, in), 0u);
}

TEST(MemoryModel, ChunkedEqualsStandardBelowOneChunk) {
  const ModelShape m = llama3_8b();
  PlanInputs in;
  in.chunk = 10240;
  in.device_budget = m.weight_bytes + (512ull << 20);  // room for a few thousand tokens
  const uint64_t standard = max_context(m, Method::kStandard, in);
  ASSERT_GT(standard, 0u);
  ASSERT_LT(standard, in.chunk);
  EXPECT_EQ(max_context(m, Method::kChunked, in), standard);
  // And every reported maximum fits while one more token does not.
  for (Method method : all_methods()) {
    const uint64_t s = max_context(m, method, in);
    in.n_ctx = s;
    EXPECT_TRUE(plan_memory(m, method, in).fits) << method_name(method) << " at " << s;
    in.n_ctx = s + 1;
    EXPECT_FALSE(plan_memory(m, method, in).fits) << method_name(method) << " at " << s + 1;
  }
}

TEST(MemoryModel, AdaptiveGroupAndFit) {
  const ModelShape m = llama3_8b();
  // Paper thresholds with a ~4 GiB ping-pong room: <=500K -> 8, 1M -> 4, 2M -> 2, 4M -> 1.
  const uint64_t room = 4ull << 30;
  EXPECT_EQ(adaptive_group(m, 500 * 1024, 2, room), 8u);
  EXPECT_EQ(adaptive_group(m, 1000 * 1024, 2, room), 4u);
  EXPECT_EQ(adaptive_group(m, 2000 * 1024, 2, room), 2u);
  EXPECT_EQ(adaptive_group(m, 4000 * 1024, 2, room), 1u);
  EXPECT_EQ(adaptive_group(m, 5000 * 1024, 2, room), 0u);
  PlanInputs in;
  in.n_ctx = 1u << 20;
  in.device_budget = 24ull << 30;
  EXPECT_FALSE(plan_memory(m, Method::kStandard, in).fits);
  const MemoryPlan h = plan_memory(m, Method::kHeadInfer, in);
  EXPECT_TRUE(h.fits);
  EXPECT_EQ(h.group, 8u);  // 8 GiB ping-pong fits next to 15 GiB of weights at 1M
  in.group = 3;
  EXPECT_THROW(plan_memory(m, Method::kHeadInfer, in), Error);
}

}  // namespace
}  // namespace kvtier::policy
