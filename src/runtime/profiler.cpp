#include "runtime/profiler.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/home_store.h"
#include "kv/ledger.h"
#include "kv/transfer_engine.h"

namespace kvtier::runtime {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmups = 3;  // FlexGen's profile_bandwidth settings
constexpr int kRepeats = 3;
constexpr int kCopies = 5;
constexpr int kProjRepeats = 5;
constexpr int kDecodeRepeats = 3;
constexpr uint64_t kAlign = 4096;               // direct I/O granularity
constexpr uint64_t kMaxJobBytes = 16ull << 20;  // keeps a profile of a 7B model short

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Loads of `job` bytes from `home` (kCopies regions) into one staging buffer through the transfer
// engine, as the KV cache does. `fill`: store every region first (a disk file's unwritten extents
// would read back without I/O).
LinkMeasurement measure_link(kv::MemoryLedger& ledger, kv::HomeStore& home, uint64_t job, double cap,
                             bool fill) {
  kv::BlockPool staging(ledger, kv::Tier::kDevice, job, 1, kAlign);
  const uint32_t slot = staging.acquire();
  kv::TransferEngine engine(home, kAlign, kCopies, 1, 0, kv::LinkLimit{cap, nullptr});
  uint8_t* buf = staging.data(slot);
  std::mt19937 rng(1);
  for (uint64_t i = 0; i < job; ++i) buf[i] = static_cast<uint8_t>(rng());
  auto copy = [&](int region) { return kv::BlockCopy{static_cast<uint64_t>(region) * job, buf, job}; };
  if (fill) {
    for (int r = 0; r < kCopies; ++r) {
      const kv::BlockCopy c = copy(r);
      engine.prepare(kv::CopyDir::kStore, {&c, 1}, {&staging, slot});
    }
    engine.drain();
  }
  for (int w = 0; w < kWarmups; ++w) {
    const kv::BlockCopy c = copy(w % kCopies);
    engine.wait(engine.prepare(kv::CopyDir::kLoad, {&c, 1}, {&staging, slot}));
  }
  std::vector<double> times;
  for (int rep = 0; rep < kRepeats; ++rep) {
    const auto t0 = Clock::now();
    for (int r = 0; r < kCopies; ++r) {
      const kv::BlockCopy c = copy(r);
      engine.prepare(kv::CopyDir::kLoad, {&c, 1}, {&staging, slot});
    }
    engine.drain();
    times.push_back(seconds_since(t0));
  }
  LinkMeasurement m;
  m.job_bytes = job;
  m.copies = kCopies;
  m.median_s = median(times);
  m.bytes_per_s = static_cast<double>(job) * kCopies / m.median_s;
  return m;
}

// The matrices one decode step multiplies a token's activations by, in the forward pass's order: each
// layer's attention and FFN projections, then the output head (absent matrices, such as OPT's gate,
// are left out).
std::vector<const cpu::WeightMatrix*> decode_matrices(const model::ModelWeights& w) {
  std::vector<const cpu::WeightMatrix*> out;
  for (const model::LayerWeights& lw : w.layers) {
    for (const cpu::WeightMatrix* mat : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.gate, &lw.up, &lw.down}) {
      if (mat->data != nullptr && mat->n_rows > 0) out.push_back(mat);
    }
  }
  if (w.output.data != nullptr && w.output.n_rows > 0) out.push_back(&w.output);
  return out;
}

// Median seconds of one token through every decode matrix (Profile::decode_weights_s). One pass
// reads all the weights, as a decode step does, so the caches hold little of them (unlike a timed
// loop over one layer's wk and wv, which may fit in the last-level cache).
double measure_decode_weights(const model::ModelWeights& w, ThreadPool& pool, cpu::Isa isa) {
  const std::vector<const cpu::WeightMatrix*> mats = decode_matrices(w);
  int64_t k_max = 1, rows_max = 1;
  size_t scratch_bytes = 0;
  for (const cpu::WeightMatrix* mat : mats) {
    k_max = std::max(k_max, mat->k);
    rows_max = std::max(rows_max, mat->n_rows);
    scratch_bytes = std::max(scratch_bytes, cpu::matmul_scratch_bytes(mat->type, mat->k, 1));
  }
  std::vector<float> x(static_cast<size_t>(k_max));     // [k_max] f32 one token's input
  std::vector<float> y(static_cast<size_t>(rows_max));  // [rows_max] f32 its output
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> scratch(scratch_bytes);
  auto pass = [&] {
    for (const cpu::WeightMatrix* mat : mats) cpu::matmul(pool, isa, *mat, x.data(), 1, y.data(), scratch);
  };
  pass();  // warm-up (and the first touch of mapped weights)
  std::vector<double> times;
  for (int r = 0; r < kDecodeRepeats; ++r) {
    const auto t0 = Clock::now();
    pass();
    times.push_back(seconds_since(t0));
  }
  return median(times);
}

}  // namespace

ProfileKey profile_key(const LoadedModel& m, const ProfileOptions& o) {
  const model::Hparams& hp = m.hparams;
  std::string shape = fmt::format("{}|{}|{}|", hp.arch_name, hp.n_layer, hp.n_embd);
  for (const model::LayerWeights& lw : m.weights.layers) {
    shape += fmt::format("k:{},{},{};v:{},{},{}|", ggml_type_name(lw.wk.type), lw.wk.n_rows, lw.wk.k,
                         ggml_type_name(lw.wv.type), lw.wv.n_rows, lw.wv.k);
  }
  // The decode weight pass (decode_weights_s) reads every matrix.
  shape += "decode:";
  for (const cpu::WeightMatrix* mat : decode_matrices(m.weights))
    shape += fmt::format("{},{},{};", ggml_type_name(mat->type), mat->n_rows, mat->k);
  ProfileKey k;
  k.model_hash = fmt::format("{:016x}", fnv1a(shape));
  k.cpu = cpu::cpu_brand();
  k.isa = std::string(cpu::isa_name(o.isa));
  k.threads = o.threads;
  k.disk_dir = o.disk_dir;
  k.link_bytes_per_s = o.link_bytes_per_s;
  return k;
}

Profile measure_profile(const LoadedModel& m, const ProfileOptions& o) {
  KVTIER_ASSERT(o.threads >= 1 && o.transfer_tokens >= 1 && o.proj_tokens >= 1);
  if (m.weights.layers.empty()) fail(ErrorKind::kInvalidFile, "the model has no layers to profile");
  Profile p;
  p.key = profile_key(m, o);
  const model::Hparams& hp = m.hparams;
  const model::LayerWeights& lw = m.weights.layers.front();
  const int64_t n_embd = lw.wk.k;

  // Per-token sizes of this model (layer 0; the layers of supported models share them).
  p.kv_bytes_per_token = static_cast<double>(hp.n_head_kv.at(0)) * (hp.head_dim_k + hp.head_dim_v) * 2.0;
  const cpu::ActFormat fk = cpu::act_format_for(lw.wk.type);
  const cpu::ActFormat fv = cpu::act_format_for(lw.wv.type);
  p.x_bytes_per_token = fk == fv ? static_cast<double>(cpu::act_row_bytes(fk, n_embd)) : 4.0 * n_embd;
  p.proj_flops_per_token =
      2.0 * static_cast<double>(n_embd) * static_cast<double>(lw.wk.n_rows + lw.wv.n_rows);

  // The link.
  uint64_t job = static_cast<uint64_t>(p.kv_bytes_per_token * static_cast<double>(o.transfer_tokens));
  job = std::clamp<uint64_t>((job + kAlign - 1) / kAlign * kAlign, kAlign, kMaxJobBytes);
  kv::MemoryLedger ledger;
  {
    auto home = kv::make_host_store(ledger, job * kCopies);
    p.host = measure_link(ledger, *home, job, o.link_bytes_per_s, false);
  }
  if (!o.disk_dir.empty()) {
    auto home = kv::make_disk_store(ledger, o.disk_dir, job * kCopies);
    p.disk_io = home->alignment() > 1 ? "O_DIRECT" : "buffered I/O";
    p.disk = measure_link(ledger, *home, job, o.link_bytes_per_s, true);
  }

  // The K/V projection: both matmuls of one layer over proj_tokens tokens.
  ThreadPool pool(o.threads);
  const int64_t n = o.proj_tokens;
  std::vector<float> x(static_cast<size_t>(n * n_embd));  // [n, n_embd] f32
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  std::vector<float> yk(static_cast<size_t>(n * lw.wk.n_rows));  // [n, n_kv_rows] f32
  std::vector<float> yv(static_cast<size_t>(n * lw.wv.n_rows));
  std::vector<uint8_t> scratch(std::max(cpu::matmul_scratch_bytes(lw.wk.type, n_embd, n),
                                        cpu::matmul_scratch_bytes(lw.wv.type, n_embd, n)));
  auto project = [&] {
    cpu::matmul(pool, o.isa, lw.wk, x.data(), n, yk.data(), scratch);
    cpu::matmul(pool, o.isa, lw.wv, x.data(), n, yv.data(), scratch);
  };
  project();  // warm-up
  std::vector<double> times;
  for (int r = 0; r < kProjRepeats; ++r) {
    const auto t0 = Clock::now();
    project();
    times.push_back(seconds_since(t0));
  }
  const double t = median(times);
  p.proj_tokens = n;
  p.proj_tokens_per_s = static_cast<double>(n) / t;
  p.proj_flops_per_s = p.proj_flops_per_token * static_cast<double>(n) / t;
  p.decode_weights_s = measure_decode_weights(m.weights, pool, o.isa);
  return p;
}

policy::KvprCosts kvpr_costs(const Profile& p, bool disk) {
  if (disk && !p.disk)
    fail(ErrorKind::kInvalidArgument, "the profile has no disk link (profile with --kv-disk)");
  const double link = disk ? p.disk->bytes_per_s : p.host.bytes_per_s;
  policy::KvprCosts c;
  c.x_bytes = p.x_bytes_per_token;
  c.kv_bytes = p.kv_bytes_per_token;
  c.recompute_flops = p.proj_flops_per_token;
  c.v_com_x = link;
  c.v_com_kv = link;
  c.v_gpu = p.proj_flops_per_s;
  return c;
}

}  // namespace kvtier::runtime
