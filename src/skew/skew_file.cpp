#include "skew/skew_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/ranges.h>

#include "core/error.h"
#include "gguf/reader.h"
#include "gguf/writer.h"
#include "skew/skew_math.h"

namespace kvtier::skew {

namespace {

constexpr uint32_t kVersion = 1;

template <typename T>
std::vector<uint8_t> to_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <typename T>
std::vector<T> tensor_values(const gguf::File& f, const std::string& name, GgmlType type,
                             const std::vector<uint64_t>& ne) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) fail(ErrorKind::kInvalidFile, "{}: skew file lacks tensor {}", f.path(), name);
  if (t->type != type || t->ne != ne)
    fail(ErrorKind::kInvalidFile, "{}: tensor {} has type {} and shape [{}], expected {} [{}]", f.path(),
         name, ggml_type_name(t->type), fmt::join(t->ne, ", "), ggml_type_name(type), fmt::join(ne, ", "));
  std::vector<T> out(static_cast<size_t>(t->n_elements));
  KVTIER_ASSERT(t->n_bytes == out.size() * sizeof(T));
  std::memcpy(out.data(), t->data, t->n_bytes);
  return out;
}

uint32_t get_u32(const gguf::File& f, const char* key) {
  const int64_t v = f.get_int(key);
  if (v < 0 || v > int64_t{UINT32_MAX})
    fail(ErrorKind::kInvalidFile, "{}: {} = {} is out of range", f.path(), key, v);
  return static_cast<uint32_t>(v);
}

}  // namespace

double orthogonality_error(const LayerSkew& layer, int64_t d) {
  double worst = 0.0;
  for (uint32_t h = 0; h < layer.n_head_kv; ++h) {
    const float* a = layer.head_a(h, d);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        double s = 0.0;
        for (int64_t c = 0; c < d; ++c) s += static_cast<double>(a[i * d + c]) * a[j * d + c];
        worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
      }
    }
  }
  return worst;
}

void write_skew(const SkewSet& set, const std::string& path,
                const std::function<void(size_t, size_t)>& progress) {
  const uint64_t d = set.head_dim;
  const uint64_t k = set.partial_columns;
  KVTIER_ASSERT(d >= 1 && k >= 1 && k <= d && !set.layers.empty());
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("infinigen-skew"));
  w.set("infinigen.version", gguf::Value::u32(kVersion));
  w.set("infinigen.model_hash", gguf::Value::string(set.model_hash));
  w.set("infinigen.n_layer", gguf::Value::u32(static_cast<uint32_t>(set.layers.size())));
  w.set("infinigen.head_dim", gguf::Value::u32(set.head_dim));
  w.set("infinigen.partial_ratio", gguf::Value::f32(set.partial_ratio));
  w.set("infinigen.partial_columns", gguf::Value::u32(set.partial_columns));
  w.set("infinigen.sample_tokens", gguf::Value::u32(set.sample_tokens));
  w.set("infinigen.sample_source", gguf::Value::string(set.sample_source));
  for (size_t l = 0; l < set.layers.size(); ++l) {
    const LayerSkew& L = set.layers[l];
    const uint64_t h = L.n_head_kv;
    KVTIER_ASSERT(h >= 1 && L.a.size() == h * d * d && L.sigma.size() == h * d && L.cols.size() == h * k,
                  "layer {} of the skew set has inconsistent sizes", l);
    w.add_tensor_bytes(fmt::format("blk.{}.skew_a", l), GgmlType::kF32, {d, d, h}, to_bytes(L.a));
    w.add_tensor_bytes(fmt::format("blk.{}.skew_sigma", l), GgmlType::kF32, {d, h}, to_bytes(L.sigma));
    w.add_tensor_bytes(fmt::format("blk.{}.skew_cols", l), GgmlType::kI32, {k, h}, to_bytes(L.cols));
  }
  const size_t n_tensors = 3 * set.layers.size();
  w.write(path, [&](size_t done, size_t, uint64_t) {
    if (progress && done % 3 == 0) progress(done / 3, n_tensors / 3);
  });
}

SkewSet read_skew(const std::string& path, const std::string& expected_hash) {
  const gguf::File f(path);
  const auto arch = f.opt_string("general.architecture");
  if (!arch || *arch != "infinigen-skew")
    fail(ErrorKind::kInvalidFile, "{}: not an InfiniGen skew file (general.architecture is '{}')", path,
         arch.value_or("missing"));
  const uint32_t version = get_u32(f, "infinigen.version");
  if (version != kVersion)
    fail(ErrorKind::kInvalidFile, "{}: skew file version {} (this build reads version {})", path, version,
         kVersion);
  SkewSet set;
  set.model_hash = f.get_string("infinigen.model_hash");
  if (!expected_hash.empty() && set.model_hash != expected_hash)
    fail(ErrorKind::kInvalidFile,
         "{}: skew file was made for another model (its model hash is {}, this model's is {}); run `kvtier "
         "skew` on this model",
         path, set.model_hash, expected_hash);
  const uint32_t n_layer = get_u32(f, "infinigen.n_layer");
  set.head_dim = get_u32(f, "infinigen.head_dim");
  set.partial_ratio = static_cast<float>(f.get_float("infinigen.partial_ratio"));
  set.partial_columns = get_u32(f, "infinigen.partial_columns");
  set.sample_tokens = get_u32(f, "infinigen.sample_tokens");
  set.sample_source = f.get_string("infinigen.sample_source");
  const uint64_t d = set.head_dim;
  const uint64_t k = set.partial_columns;
  if (n_layer < 1 || d < 1 || k < 1 || k > d)
    fail(ErrorKind::kInvalidFile, "{}: {} layers, head_dim {}, {} partial columns", path, n_layer, d, k);
  set.layers.resize(n_layer);
  for (uint32_t l = 0; l < n_layer; ++l) {
    LayerSkew& L = set.layers[l];
    const std::string a_name = fmt::format("blk.{}.skew_a", l);
    const gguf::TensorInfo* t = f.find_tensor(a_name);
    if (t == nullptr || t->ne.size() != 3 || t->ne[2] < 1 || t->ne[2] > 4096)
      fail(ErrorKind::kInvalidFile, "{}: tensor {} is missing or not [d, d, n_head_kv]", path, a_name);
    L.n_head_kv = static_cast<uint32_t>(t->ne[2]);
    const uint64_t h = L.n_head_kv;
    L.a = tensor_values<float>(f, a_name, GgmlType::kF32, {d, d, h});
    L.sigma = tensor_values<float>(f, fmt::format("blk.{}.skew_sigma", l), GgmlType::kF32, {d, h});
    L.cols = tensor_values<int32_t>(f, fmt::format("blk.{}.skew_cols", l), GgmlType::kI32, {k, h});
    for (uint32_t hh = 0; hh < L.n_head_kv; ++hh) {
      const int32_t* c = L.head_cols(hh, static_cast<int64_t>(k));
      for (uint64_t i = 0; i < k; ++i) {
        if (c[i] < 0 || static_cast<uint64_t>(c[i]) >= d || (i > 0 && c[i] <= c[i - 1]))
          fail(ErrorKind::kInvalidFile,
               "{}: layer {} head {}: partial columns are not ascending indices below {}", path, l, hh, d);
      }
    }
    const double err = orthogonality_error(L, static_cast<int64_t>(d));
    if (!(err < 1e-4))
      fail(ErrorKind::kInvalidFile,
           "{}: layer {}: a skewing matrix is not orthogonal (|A·A^T - I| = {:.3g}); the file is corrupt",
           path, l, err);
  }
  return set;
}

SkewSet identity_skew(const std::vector<uint32_t>& n_head_kv, uint32_t head_dim, float partial_ratio) {
  SkewSet set;
  set.model_hash = "";
  set.head_dim = head_dim;
  set.partial_ratio = partial_ratio;
  const int64_t d = head_dim;
  const int64_t k = partial_columns(partial_ratio, d);
  set.partial_columns = static_cast<uint32_t>(k);
  set.sample_source = "identity (no sample)";
  for (uint32_t hk : n_head_kv) {
    LayerSkew ls;
    ls.n_head_kv = hk;
    ls.a.assign(static_cast<size_t>(hk) * d * d, 0.0f);
    ls.sigma.assign(static_cast<size_t>(hk) * d, 1.0f);
    for (uint32_t h = 0; h < hk; ++h) {
      for (int64_t i = 0; i < d; ++i) ls.a[(static_cast<size_t>(h) * d + i) * d + i] = 1.0f;
      for (int64_t c = 0; c < k; ++c) ls.cols.push_back(static_cast<int32_t>(c));
    }
    set.layers.push_back(std::move(ls));
  }
  return set;
}

}  // namespace kvtier::skew
