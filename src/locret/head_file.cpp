#include "locret/head_file.h"

#include <cstring>

#include "core/error.h"
#include "gguf/reader.h"
#include "gguf/writer.h"

namespace kvtier::locret {
namespace {

constexpr uint32_t kFormatVersion = 1;

std::string tensor_name(uint32_t l, int fc, const char* suffix) {
  return fmt::format("locret.blk.{}.fc{}.{}", l, fc, suffix);
}

void add_f32(gguf::Writer& w, std::string name, const std::vector<float>& data, uint64_t ne0, uint64_t ne1) {
  std::vector<uint8_t> bytes(data.size() * sizeof(float));
  std::memcpy(bytes.data(), data.data(), bytes.size());
  w.add_tensor_bytes(std::move(name), GgmlType::kF32, {ne0, ne1}, std::move(bytes));
}

void read_f32(const gguf::File& f, const std::string& name, uint64_t ne0, uint64_t ne1,
              std::vector<float>& out) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (t == nullptr) fail(ErrorKind::kInvalidFile, "{}: retaining-head tensor {} is missing", f.path(), name);
  if (t->type != GgmlType::kF32 || t->ne.size() != 2 || t->ne[0] != ne0 || t->ne[1] != ne1) {
    fail(ErrorKind::kInvalidFile, "{}: tensor {} should be F32 of shape [{}, {}]", f.path(), name, ne0, ne1);
  }
  out.resize(static_cast<size_t>(ne0 * ne1));
  std::memcpy(out.data(), t->data, out.size() * sizeof(float));
}

uint64_t u(int64_t v) {
  return static_cast<uint64_t>(v);
}

}  // namespace

void save_heads(const std::string& path, const RetainingHeads& heads, const HeadFileMeta& meta,
                const OptimizerState* optimizer) {
  const HeadShapes& s = heads.shapes();
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("locret-heads"));
  w.set("general.alignment", gguf::Value::u32(32));
  w.set("locret.format_version", gguf::Value::u32(kFormatVersion));
  w.set("locret.model_hash", gguf::Value::string(meta.model_hash));
  w.set("locret.model_name", gguf::Value::string(meta.model_name));
  w.set("locret.layer_count", gguf::Value::u32(s.n_layer()));
  w.set("locret.intermediate_size", gguf::Value::u32(static_cast<uint32_t>(s.d_m)));
  w.set("locret.activation", gguf::Value::string(activation_name(s.act)));
  // The split of d_in into q, k, v (the same for every layer; h_kv per layer comes from fc2).
  KVTIER_ASSERT(s.n_layer() > 0);
  w.set("locret.head_count", gguf::Value::u32(static_cast<uint32_t>(s.layers[0].n_head)));
  w.set("locret.key_length", gguf::Value::u32(static_cast<uint32_t>(s.layers[0].head_dim_k)));
  w.set("locret.value_length", gguf::Value::u32(static_cast<uint32_t>(s.layers[0].head_dim_v)));
  for (const auto& [k, v] : meta.provenance) w.set("locret.provenance." + k, gguf::Value::string(v));
  if (optimizer != nullptr) w.set("locret.train.step", gguf::Value::u64(u(optimizer->step)));
  for (uint32_t l = 0; l < s.n_layer(); ++l) {
    const LayerShape& ls = s.layers[l];
    add_f32(w, tensor_name(l, 1, "weight"), heads.layer(l).fc1, u(ls.d_in()), u(s.d_m));
    add_f32(w, tensor_name(l, 2, "weight"), heads.layer(l).fc2, u(s.d_m), u(ls.n_head_kv));
    if (optimizer != nullptr) {
      add_f32(w, tensor_name(l, 1, "adam_m"), optimizer->m.at(l).fc1, u(ls.d_in()), u(s.d_m));
      add_f32(w, tensor_name(l, 2, "adam_m"), optimizer->m.at(l).fc2, u(s.d_m), u(ls.n_head_kv));
      add_f32(w, tensor_name(l, 1, "adam_v"), optimizer->v.at(l).fc1, u(ls.d_in()), u(s.d_m));
      add_f32(w, tensor_name(l, 2, "adam_v"), optimizer->v.at(l).fc2, u(s.d_m), u(ls.n_head_kv));
    }
  }
  w.write(path);
}

HeadFile read_heads(const std::string& path) {
  const gguf::File f(path);
  if (f.opt_string("general.architecture") != "locret-heads") {
    fail(ErrorKind::kInvalidFile,
         "{} is not a retaining-head file (general.architecture is not locret-heads)", path);
  }
  const int64_t version = f.get_int("locret.format_version");
  if (version != kFormatVersion)
    fail(ErrorKind::kInvalidFile, "{}: retaining-head format version {}, this build reads {}", path, version,
         kFormatVersion);
  HeadFile out;
  out.meta.model_hash = f.get_string("locret.model_hash");
  out.meta.model_name = f.opt_string("locret.model_name").value_or("");
  for (const auto& kv : f.metadata()) {
    static constexpr std::string_view kPrefix = "locret.provenance.";
    if (kv.key.starts_with(kPrefix) && kv.value.as_string() != nullptr)
      out.meta.provenance.emplace_back(kv.key.substr(kPrefix.size()), *kv.value.as_string());
  }
  const int64_t n_layer = f.get_int("locret.layer_count");
  const int64_t d_m = f.get_int("locret.intermediate_size");
  if (n_layer <= 0 || d_m <= 0)
    fail(ErrorKind::kInvalidFile, "{}: {} layers of intermediate size {}", path, n_layer, d_m);
  HeadShapes shapes;
  shapes.d_m = d_m;
  shapes.act = activation_from_name(f.get_string("locret.activation").c_str());
  const int64_t n_head = f.get_int("locret.head_count");
  const int64_t dk = f.get_int("locret.key_length");
  const int64_t dv = f.get_int("locret.value_length");
  for (int64_t l = 0; l < n_layer; ++l) {
    const gguf::TensorInfo* t2 = f.find_tensor(tensor_name(static_cast<uint32_t>(l), 2, "weight"));
    if (t2 == nullptr || t2->ne.size() != 2)
      fail(ErrorKind::kInvalidFile, "{}: the retaining head of layer {} is missing or not 2-D", path, l);
    shapes.layers.push_back({n_head, static_cast<int64_t>(t2->ne[1]), dk, dv});
  }
  if (n_head <= 0 || dk <= 0 || dv <= 0)
    fail(ErrorKind::kInvalidFile, "{}: {} heads of {} / {} dims", path, n_head, dk, dv);
  // Every tensor's shape is checked before anything is allocated from the metadata's sizes.
  for (uint32_t l = 0; l < shapes.n_layer(); ++l) {
    const std::pair<uint64_t, uint64_t> dims[] = {{u(shapes.layers[l].d_in()), u(d_m)},
                                                  {u(d_m), u(shapes.layers[l].n_head_kv)}};
    for (int fc = 1; fc <= 2; ++fc) {
      const std::string name = tensor_name(l, fc, "weight");
      const gguf::TensorInfo* t = f.find_tensor(name);
      const auto [ne0, ne1] = dims[fc - 1];
      if (t == nullptr) fail(ErrorKind::kInvalidFile, "{}: retaining-head tensor {} is missing", path, name);
      if (t->type != GgmlType::kF32 || t->ne.size() != 2 || t->ne[0] != ne0 || t->ne[1] != ne1)
        fail(ErrorKind::kInvalidFile, "{}: tensor {} should be F32 of shape [{}, {}]", path, name, ne0, ne1);
    }
  }
  RetainingHeads heads(shapes);
  std::optional<OptimizerState> opt;
  if (f.find("locret.train.step") != nullptr) {
    opt = OptimizerState::zeros(shapes);
    opt->step = f.get_int("locret.train.step");
  }
  for (uint32_t l = 0; l < shapes.n_layer(); ++l) {
    const uint64_t d_in = u(shapes.layers[l].d_in());
    const uint64_t hk = u(shapes.layers[l].n_head_kv);
    read_f32(f, tensor_name(l, 1, "weight"), d_in, u(d_m), heads.layer(l).fc1);
    read_f32(f, tensor_name(l, 2, "weight"), u(d_m), hk, heads.layer(l).fc2);
    if (opt) {
      read_f32(f, tensor_name(l, 1, "adam_m"), d_in, u(d_m), opt->m[l].fc1);
      read_f32(f, tensor_name(l, 2, "adam_m"), u(d_m), hk, opt->m[l].fc2);
      read_f32(f, tensor_name(l, 1, "adam_v"), d_in, u(d_m), opt->v[l].fc1);
      read_f32(f, tensor_name(l, 2, "adam_v"), u(d_m), hk, opt->v[l].fc2);
    }
  }
  out.heads = std::move(heads);
  out.optimizer = std::move(opt);
  return out;
}

HeadFile load_heads(const std::string& path, const std::string& model_hash, const model::ModelConfig& cfg) {
  HeadFile hf = read_heads(path);
  if (hf.meta.model_hash != model_hash) {
    fail(ErrorKind::kInvalidFile,
         "{}: the retaining heads were trained for the model with hash {} ({}), but this model's hash is {}; "
         "train heads for it with `kvtier train-locret`{}",
         path, hf.meta.model_hash, hf.meta.model_name.empty() ? "unnamed" : hf.meta.model_name, model_hash,
         hf.meta.model_hash.starts_with("fp64v1:")
             ? " (this file predates the switch to XXH3-64 model hashes)"
             : "");
  }
  const HeadShapes want = head_shapes(cfg, hf.heads.shapes().d_m);
  const HeadShapes& got = hf.heads.shapes();
  if (got.n_layer() != want.n_layer())
    fail(ErrorKind::kInvalidFile, "{}: retaining heads for {} layers, the model has {}", path, got.n_layer(),
         want.n_layer());
  if (got.act != want.act)
    fail(ErrorKind::kInvalidFile, "{}: retaining heads use {}, the model's activation is {}", path,
         activation_name(got.act), activation_name(want.act));
  for (uint32_t l = 0; l < want.n_layer(); ++l) {
    const LayerShape& g = got.layers[l];
    const LayerShape& w = want.layers[l];
    if (!(g == w))
      fail(ErrorKind::kInvalidFile,
           "{}: layer {}: heads over {} q / {} kv heads of {} / {} dims, the model has {} / {} of {} / {}",
           path, l, g.n_head, g.n_head_kv, g.head_dim_k, g.head_dim_v, w.n_head, w.n_head_kv, w.head_dim_k,
           w.head_dim_v);
  }
  return hf;
}

}  // namespace kvtier::locret
