// Synthetic weights generated on the device are bit-identical to model/synthetic.h's CPU values
// (as f32, and after the same bf16 rounding).
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/synth.h"
#include "core/half.h"
#include "gpu_test_util.h"
#include "model/synthetic.h"

namespace kvtier::cuda {
namespace {

using test::DeviceBuffer;

TEST(CudaSynth, DeviceValuesEqualCpuValues) {
  KVTIER_REQUIRE_GPU();
  model::SynthTensor t;
  t.name = "blk.3.attn_q.weight";
  t.ne = {4096, 4096};
  t.type = GgmlType::kBF16;
  t.init = model::SynthInit::kUniform;
  t.scale = 0.02f;
  const uint64_t seed = 1234;
  const uint64_t first = 4096 * 17 + 5;
  const int64_t n = 10000;
  std::vector<float> want(static_cast<size_t>(n));
  model::synth_values(t, seed, first, want);
  const uint64_t key = synth_key(seed, t.name);
  DeviceBuffer<float> f(static_cast<size_t>(n));
  synth_uniform_f32(key, t.scale, first, n, f.get(), nullptr);
  EXPECT_TRUE(test::same_bits(f.download(), want));
  DeviceBuffer<uint16_t> b(static_cast<size_t>(n));
  synth_uniform_bf16(key, t.scale, first, n, b.get(), nullptr);
  const auto got = b.download();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)], f32_to_bf16(want[static_cast<size_t>(i)]));
  fill_f32(1.0f, n, f.get(), nullptr);
  for (float x : f.download()) ASSERT_EQ(x, 1.0f);
}

}  // namespace
}  // namespace kvtier::cuda
