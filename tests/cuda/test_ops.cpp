// CUDA float ops and KV row ops against the CPU backend's scalar references, on random inputs.
// Tolerances (NMSE = sum (gpu - ref)^2 / sum ref^2), each from how the two sides compute:
// - add, add_rows, mul, relu, scale, embedding, conversions, KV append/gather/scatter: the same single
//   roundings on both sides: bit-identical.
// - silu, gelu, softcap, SwiGLU/GeGLU: CUDA expf/tanhf are within 2 ulp of the C library's, plus the
//   same few roundings: per-element relative error ~1e-6 at worst, NMSE <= 1e-12.
// - rms_norm, layer_norm: a different summation order (strided partial sums and a tree vs left to
//   right): relative error up to ~n u in the scale factor, NMSE <= 1e-10 for n <= 8192.
// - RoPE: angles in double on both sides, rounded to f32 (CUDA's pow/sincos are within 2 ulp of
//   double, so the f32 angles almost always agree), rotation with the same single roundings:
//   NMSE <= 1e-12.
// Every op is also run twice: bit-identical results.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/float_ops.h"
#include "backend/cuda/kv_ops.h"
#include "backend/cuda/ops.h"
#include "core/half.h"
#include "gpu_test_util.h"

namespace kvtier::cuda {
namespace {

using test::DeviceBuffer;
using test::nmse;
using test::random_floats;
using test::same_bits;

constexpr cpu::Isa kRef = cpu::Isa::kScalar;

TEST(CudaOps, EmbeddingAndBf16ConversionsAreExact) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(1);
  const int64_t n_vocab = 100, dim = 72, n_tok = 9;
  const auto tf = random_floats(static_cast<size_t>(n_vocab * dim), rng);
  std::vector<uint16_t> table(tf.size());
  for (size_t i = 0; i < tf.size(); ++i) table[i] = f32_to_bf16(tf[i]);
  std::vector<int32_t> ids = {0, 5, 99, 5, 42, 7, 1, 98, 3};
  DeviceBuffer<uint16_t> d_table(table);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(static_cast<size_t>(n_tok * dim));
  for (float s : {1.0f, 8.48528f}) {
    embedding_bf16(d_table.get(), d_ids.get(), n_tok, dim, s, d_out.get(), nullptr);
    const auto out = d_out.download();
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t c = 0; c < dim; ++c) {
        const float v = bf16_to_f32(table[static_cast<size_t>(ids[static_cast<size_t>(t)] * dim + c)]);
        ASSERT_EQ(out[static_cast<size_t>(t * dim + c)], s == 1.0f ? v : v * s) << t << "," << c;
      }
    }
  }
  // f32 -> bf16 -> f32 round trip against the host's rounding.
  DeviceBuffer<float> d_x(tf);
  DeviceBuffer<uint16_t> d_b(tf.size());
  cast_f32_to_bf16(d_x.get(), static_cast<int64_t>(tf.size()), d_b.get(), nullptr);
  EXPECT_EQ(d_b.download(), table);
  cast_bf16_to_f32(d_b.get(), static_cast<int64_t>(tf.size()), d_x.get(), nullptr);
  const auto back = d_x.download();
  for (size_t i = 0; i < tf.size(); ++i) ASSERT_EQ(back[i], bf16_to_f32(table[i]));
}

TEST(CudaOps, NormsMatchCpuReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(2);
  constexpr double kTol = 1e-10;
  for (int64_t n : {1, 7, 64, 577, 2048, 8192}) {
    const int64_t rows = 3;
    const auto x = random_floats(static_cast<size_t>(rows * n), rng, 2.0f);
    const auto w = random_floats(static_cast<size_t>(n), rng);
    const auto b = random_floats(static_cast<size_t>(n), rng);
    DeviceBuffer<float> dx(x), dw(w), db(b), dy(x.size());
    for (bool weighted : {false, true}) {
      std::vector<float> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        cpu::rms_norm(kRef, x.data() + r * n, weighted ? w.data() : nullptr, 1e-6f, n, ref.data() + r * n);
      }
      rms_norm(dx.get(), weighted ? dw.get() : nullptr, 1e-6f, rows, n, dy.get(), nullptr);
      const auto got = dy.download();
      EXPECT_LE(nmse(got, ref), kTol) << "rms_norm n=" << n;
      rms_norm(dx.get(), weighted ? dw.get() : nullptr, 1e-6f, rows, n, dy.get(), nullptr);
      EXPECT_TRUE(same_bits(dy.download(), got)) << "rms_norm not deterministic, n=" << n;

      for (int64_t r = 0; r < rows; ++r) {
        cpu::layer_norm(kRef, x.data() + r * n, weighted ? w.data() : nullptr, weighted ? b.data() : nullptr,
                        1e-5f, n, ref.data() + r * n);
      }
      layer_norm(dx.get(), weighted ? dw.get() : nullptr, weighted ? db.get() : nullptr, 1e-5f, rows, n,
                 dy.get(), nullptr);
      const auto got_ln = dy.download();
      EXPECT_LE(nmse(got_ln, ref), kTol) << "layer_norm n=" << n;
      layer_norm(dx.get(), weighted ? dw.get() : nullptr, weighted ? db.get() : nullptr, 1e-5f, rows, n,
                 dy.get(), nullptr);
      EXPECT_TRUE(same_bits(dy.download(), got_ln)) << "layer_norm not deterministic, n=" << n;
    }
  }
}

TEST(CudaOps, ElementwiseMatchCpuReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(3);
  constexpr double kTolTranscendental = 1e-12;
  const int64_t n = 10007;
  const auto a = random_floats(static_cast<size_t>(n), rng, 4.0f);
  const auto b = random_floats(static_cast<size_t>(n), rng, 4.0f);
  DeviceBuffer<float> da(a), db(b), dy(a.size());
  std::vector<float> ref(a.size());

  cpu::add(kRef, a.data(), b.data(), n, ref.data());
  add(da.get(), db.get(), n, dy.get(), nullptr);
  EXPECT_TRUE(same_bits(dy.download(), ref)) << "add";
  cpu::mul(kRef, a.data(), b.data(), n, ref.data());
  mul(da.get(), db.get(), n, dy.get(), nullptr);
  EXPECT_TRUE(same_bits(dy.download(), ref)) << "mul";
  cpu::relu(kRef, a.data(), n, ref.data());
  relu(da.get(), n, dy.get(), nullptr);
  EXPECT_TRUE(same_bits(dy.download(), ref)) << "relu";
  for (size_t i = 0; i < a.size(); ++i) ref[i] = 0.125f * a[i];
  scale(da.get(), 0.125f, n, dy.get(), nullptr);
  EXPECT_TRUE(same_bits(dy.download(), ref)) << "scale";

  // Bias over rows of a strided view: rows of 1000 taken 1001 apart, written densely.
  const int64_t rows = 9, cols = 1000;
  for (int64_t r = 0; r < rows; ++r) {
    cpu::add(kRef, a.data() + r * (cols + 1), b.data(), cols, ref.data() + r * cols);
  }
  add_rows(da.get(), cols + 1, db.get(), rows, cols, dy.get(), cols, nullptr);
  const auto biased = dy.download();
  EXPECT_TRUE(same_bits(std::vector<float>(biased.begin(), biased.begin() + rows * cols),
                        std::vector<float>(ref.begin(), ref.begin() + rows * cols)))
      << "add_rows";

  cpu::silu(kRef, a.data(), n, ref.data());
  silu(da.get(), n, dy.get(), nullptr);
  EXPECT_LE(nmse(dy.download(), ref), kTolTranscendental) << "silu";
  cpu::gelu_tanh(kRef, a.data(), n, ref.data());
  gelu_tanh(da.get(), n, dy.get(), nullptr);
  EXPECT_LE(nmse(dy.download(), ref), kTolTranscendental) << "gelu_tanh";
  for (size_t i = 0; i < a.size(); ++i) ref[i] = 5.0f * std::tanh(a[i] / 5.0f);
  softcap(da.get(), 5.0f, n, dy.get(), nullptr);
  const auto sc = dy.download();
  EXPECT_LE(nmse(sc, ref), kTolTranscendental) << "softcap";
  softcap(da.get(), 5.0f, n, dy.get(), nullptr);
  EXPECT_TRUE(same_bits(dy.download(), sc)) << "softcap not deterministic";
}

TEST(CudaOps, GatedProductsMatchCpuReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(4);
  constexpr double kTol = 1e-12;
  const int64_t rows = 5, cols = 1000;
  // A fused projection [rows, 2 * cols]: gate in the first half of each row, up in the second.
  const auto fused = random_floats(static_cast<size_t>(rows * 2 * cols), rng, 3.0f);
  DeviceBuffer<float> df(fused), dy(static_cast<size_t>(rows * cols));
  for (GluAct act : {GluAct::kSilu, GluAct::kGeluTanh}) {
    std::vector<float> ref(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = fused.data() + r * 2 * cols;
      float* y = ref.data() + r * cols;
      if (act == GluAct::kSilu) {
        cpu::silu(kRef, g, cols, y);
      } else {
        cpu::gelu_tanh(kRef, g, cols, y);
      }
      cpu::mul(kRef, y, g + cols, cols, y);
    }
    glu(act, df.get(), 2 * cols, df.get() + cols, 2 * cols, rows, cols, dy.get(), cols, nullptr);
    const auto got = dy.download();
    EXPECT_LE(nmse(got, ref), kTol) << (act == GluAct::kSilu ? "swiglu" : "geglu");
    glu(act, df.get(), 2 * cols, df.get() + cols, 2 * cols, rows, cols, dy.get(), cols, nullptr);
    EXPECT_TRUE(same_bits(dy.download(), got));
  }
}

// The angles of model/rope.cpp: theta = pos * scale * base^(-2p / n_rot) / factor[p], in double.
void ref_angles(int64_t pos, int64_t n_rot, float base, float scale, const float* factors, float* c,
                float* s) {
  for (int64_t p = 0; p < n_rot / 2; ++p) {
    double inv =
        std::pow(static_cast<double>(base), -2.0 * static_cast<double>(p) / static_cast<double>(n_rot));
    if (factors != nullptr) inv /= static_cast<double>(factors[p]);
    const double angle = static_cast<double>(pos) * static_cast<double>(scale) * inv;
    c[p] = static_cast<float>(std::cos(angle));
    s[p] = static_cast<float>(std::sin(angle));
  }
}

TEST(CudaOps, RopeMatchesCpuReference) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(5);
  constexpr double kTol = 1e-12;
  const int64_t n_tok = 6, n_heads = 4, head_dim = 128;
  const std::vector<int32_t> pos = {0, 1, 17, 4095, 8191, 131071};
  std::vector<float> factors(64);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + static_cast<float>(i) * 0.5f;
  DeviceBuffer<int32_t> dpos(pos);
  DeviceBuffer<float> dfac(factors);
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
    for (int64_t n_rot : {int64_t{128}, int64_t{64}}) {
      for (bool with_factors : {false, true}) {
        // q inside a wider row (token stride > n_heads * head_dim), as in a fused QKV buffer.
        const int64_t stride = n_heads * head_dim + 64;
        const auto x = random_floats(static_cast<size_t>(n_tok * stride), rng);
        std::vector<float> ref = x;
        std::vector<float> c(static_cast<size_t>(n_rot / 2)), s(c.size());
        for (int64_t t = 0; t < n_tok; ++t) {
          ref_angles(pos[static_cast<size_t>(t)], n_rot, 500000.0f, 1.0f,
                     with_factors ? factors.data() : nullptr, c.data(), s.data());
          cpu::rope(kRef, ref.data() + t * stride, n_heads, head_dim, n_rot, c.data(), s.data(),
                    mode == RopeMode::kNeox ? cpu::RopeMode::kNeox : cpu::RopeMode::kNormal);
        }
        DeviceBuffer<float> dx(x);
        RopeParams p;
        p.head_dim = head_dim;
        p.n_rot = n_rot;
        p.base = 500000.0f;
        p.freq_factors = with_factors ? dfac.get() : nullptr;
        p.mode = mode;
        rope(p, dx.get(), stride, n_tok, n_heads, dpos.get(), nullptr);
        const auto got = dx.download();
        EXPECT_LE(nmse(got, ref), kTol) << "mode " << static_cast<int>(mode) << " n_rot " << n_rot;
        dx.upload(x);
        rope(p, dx.get(), stride, n_tok, n_heads, dpos.get(), nullptr);
        EXPECT_TRUE(same_bits(dx.download(), got));
      }
    }
  }
}

TEST(CudaKvOps, AppendGatherScatterAreExact) {
  KVTIER_REQUIRE_GPU();
  std::mt19937 rng(6);
  const int64_t n_kv = 3, hd = 64, cap = 40, n_new = 5, row0 = 11;
  const auto src = random_floats(static_cast<size_t>(n_new * n_kv * hd), rng);
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    DeviceBuffer<uint8_t> cache(static_cast<size_t>(n_kv * cap * hd) * kv_dtype_bytes(dt));
    cache.fill_bytes(0);
    DeviceBuffer<float> dsrc(src);
    const KvCacheView view{cache.get(), cap * hd, hd, dt};
    kv_append(dsrc.get(), n_kv * hd, n_new, n_kv, view, row0, nullptr, nullptr);
    DeviceBuffer<float> back(static_cast<size_t>(n_kv * n_new * hd));
    kv_to_f32(view, row0, n_new, n_kv, back.get(), nullptr);
    const auto got = back.download();
    for (int64_t h = 0; h < n_kv; ++h) {
      for (int64_t t = 0; t < n_new; ++t) {
        for (int64_t i = 0; i < hd; ++i) {
          const float v = src[static_cast<size_t>((t * n_kv + h) * hd + i)];
          const float want = dt == KvDtype::kF32   ? v
                             : dt == KvDtype::kF16 ? f16_to_f32(f32_to_f16(v))
                                                   : bf16_to_f32(f32_to_bf16(v));
          ASSERT_EQ(got[static_cast<size_t>((h * n_new + t) * hd + i)], want) << h << "," << t << "," << i;
        }
      }
    }
    // Append at explicit rows, gather them into a dense span, scatter back elsewhere.
    const std::vector<int32_t> rows = {30, 2, 39, 0, 25};
    DeviceBuffer<int32_t> drows(rows);
    kv_append(dsrc.get(), n_kv * hd, n_new, n_kv, view, 0, drows.get(), nullptr);
    DeviceBuffer<uint8_t> dense(static_cast<size_t>(n_kv * n_new * hd) * kv_dtype_bytes(dt));
    const KvCacheView dview{dense.get(), n_new * hd, hd, dt};
    kv_gather(view, drows.get(), n_new, n_kv, dview, nullptr);
    kv_to_f32(dview, 0, n_new, n_kv, back.get(), nullptr);
    EXPECT_TRUE(same_bits(back.download(), got)) << "gather of appended rows";
    const std::vector<int32_t> dst_rows = {1, 3, 5, 7, 9};
    DeviceBuffer<int32_t> ddst(dst_rows);
    kv_scatter(dview, ddst.get(), n_new, n_kv, view, nullptr);
    DeviceBuffer<uint8_t> dense2(dense.size());
    const KvCacheView dview2{dense2.get(), n_new * hd, hd, dt};
    kv_gather(view, ddst.get(), n_new, n_kv, dview2, nullptr);
    kv_to_f32(dview2, 0, n_new, n_kv, back.get(), nullptr);
    EXPECT_TRUE(same_bits(back.download(), got)) << "scatter then gather";
  }
}

}  // namespace
}  // namespace kvtier::cuda
