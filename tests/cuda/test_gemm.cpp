// cuBLAS GEMM (bf16 in, f32 accumulate and out) and the upload of GGUF weights as bf16.
// Tolerances: products of bf16 values are exact in f32; the sums differ from a double reference over
// the same bf16 values in order and rounding. Tensor cores accumulate in f32 but may align addends
// by truncation (one-sided error ~u per k-step of the MMA), so for k <= 4096 the relative error is
// ~1e-5 at worst: NMSE <= 1e-8 (a wrong layout or transpose gives NMSE ~1). The weight upload is
// exact: the CPU backend's dequantisation, one bf16 rounding, a byte copy.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/dequant.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/pinned_pool.h"
#include "backend/cuda/stream.h"
#include "backend/cuda/weight_upload.h"
#include "core/half.h"
#include "core/quantize_ref.h"
#include "gpu_test_util.h"

namespace kvtier::cuda {
namespace {

using test::DeviceBuffer;
using test::nmse;
using test::random_floats;
using test::same_bits;

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

TEST(CudaGemm, Bf16MatchesDoubleReferenceAndIsDeterministic) {
  KVTIER_REQUIRE_GPU();
  constexpr double kTol = 1e-8;
  std::mt19937 rng(7);
  DeviceArena arena(size_t{256} << 20);
  Blas blas(arena);
  Stream stream;
  struct Shape {
    int64_t n_tokens, k, n_out;
  };
  for (const Shape s :
       {Shape{1, 576, 1536}, Shape{7, 64, 33}, Shape{128, 4096, 1024}, Shape{300, 960, 512}}) {
    const auto w = to_bf16(random_floats(static_cast<size_t>(s.n_out * s.k), rng, 0.05f));
    const auto xf = random_floats(static_cast<size_t>(s.n_tokens * s.k), rng);
    const auto x = to_bf16(xf);
    std::vector<float> ref(static_cast<size_t>(s.n_tokens * s.n_out));
    for (int64_t t = 0; t < s.n_tokens; ++t) {
      for (int64_t o = 0; o < s.n_out; ++o) {
        double acc = 0.0;
        for (int64_t i = 0; i < s.k; ++i) {
          acc += static_cast<double>(bf16_to_f32(x[static_cast<size_t>(t * s.k + i)])) *
                 static_cast<double>(bf16_to_f32(w[static_cast<size_t>(o * s.k + i)]));
        }
        ref[static_cast<size_t>(t * s.n_out + o)] = static_cast<float>(acc);
      }
    }
    DeviceBuffer<uint16_t> dw(w), dx(x), dxb(x.size());
    DeviceBuffer<float> dxf(xf), dy(ref.size());
    gemm_bf16(blas, dw.get(), dx.get(), s.n_tokens, s.k, s.n_out, dy.get(), stream.get());
    stream.synchronize();
    const auto got = dy.download();
    EXPECT_LE(nmse(got, ref), kTol) << s.n_tokens << "x" << s.k << "x" << s.n_out;
    gemm_bf16(blas, dw.get(), dx.get(), s.n_tokens, s.k, s.n_out, dy.get(), stream.get());
    stream.synchronize();
    EXPECT_TRUE(same_bits(dy.download(), got)) << "GEMM not deterministic";
    // From f32 activations: the same bits as rounding on the host first.
    gemm_bf16_f32in(blas, dw.get(), dxf.get(), dxb.get(), s.n_tokens, s.k, s.n_out, dy.get(), stream.get());
    stream.synchronize();
    EXPECT_TRUE(same_bits(dy.download(), got)) << "f32-input GEMM differs";
  }
}

std::vector<uint8_t> quantize(GgmlType type, const std::vector<float>& x, int64_t rows, int64_t row_len) {
  const auto& tr = ggml_traits(type);
  const size_t row_bytes = static_cast<size_t>(row_len / tr.block_size) * tr.type_size;
  std::vector<uint8_t> q(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_ref(type, std::span<const float>(x.data() + r * row_len, static_cast<size_t>(row_len)),
                     std::span<uint8_t>(q.data() + static_cast<size_t>(r) * row_bytes, row_bytes));
  }
  return q;
}

// Host part only: runs without a GPU.
TEST(CudaWeights, DequantizeToBf16IsCpuDequantThenOneRounding) {
  std::mt19937 rng(8);
  const int64_t rows = 4, row_len = 512;
  const auto x = random_floats(static_cast<size_t>(rows * row_len), rng);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    if (!can_quantize_ref(type)) continue;
    const auto q = quantize(type, x, rows, row_len);
    std::vector<float> tmp(static_cast<size_t>(row_len)), deq(tmp.size());
    std::vector<uint16_t> got(static_cast<size_t>(rows * row_len));
    dequantize_to_bf16(type, q.data(), rows, row_len, tmp, got.data());
    const auto& tr = ggml_traits(type);
    const size_t row_bytes = static_cast<size_t>(row_len / tr.block_size) * tr.type_size;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::dequantize_row(type, q.data() + static_cast<size_t>(r) * row_bytes, deq.data(), row_len);
      for (int64_t i = 0; i < row_len; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(r * row_len + i)], f32_to_bf16(deq[static_cast<size_t>(i)]))
            << tr.name << " row " << r << " elem " << i;
      }
    }
  }
  std::vector<float> tmp(32);
  std::vector<uint16_t> out(32);
  std::vector<uint8_t> junk(64);
  EXPECT_THROW(dequantize_to_bf16(GgmlType::kIQ2_XXS, junk.data(), 1, 256, tmp, out.data()), Error);
}

TEST(CudaWeights, UploadInPiecesMatchesHostDequantisation) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(9);
  const int64_t rows = 37, row_len = 256;
  const auto x = random_floats(static_cast<size_t>(rows * row_len), rng);
  const auto q = quantize(GgmlType::kQ8_0, x, rows, row_len);
  std::vector<float> tmp(static_cast<size_t>(row_len));
  std::vector<uint16_t> want(static_cast<size_t>(rows * row_len));
  dequantize_to_bf16(GgmlType::kQ8_0, q.data(), rows, row_len, tmp, want.data());
  PinnedHostPool pool(size_t{1} << 20);
  Stream stream;
  DeviceBuffer<uint16_t> dst(want.size());
  // 5 rows per piece: 8 pieces, the last one short.
  upload_weight_bf16(GgmlType::kQ8_0, q.data(), rows, row_len, dst.get(), pool, 5 * row_len * 2,
                     stream.get());
  EXPECT_EQ(dst.download(), want);
  EXPECT_EQ(pool.used(), 0u);  // the staging buffer was released
}

}  // namespace
}  // namespace kvtier::cuda
