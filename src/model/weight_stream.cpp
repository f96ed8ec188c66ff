#include "model/weight_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "core/error.h"

namespace kvtier::model {
namespace {

constexpr uint64_t kPage = 4096;     // O_DIRECT granularity, and the slots' alignment
constexpr uint64_t kHostAlign = 32;  // tensors in the host copy (the GGUF default alignment)
constexpr uint64_t kPinBlock = 1 << 20;

uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
uint64_t align_down(uint64_t v, uint64_t a) {
  return v / a * a;
}

// A layer's tensors in transfer order: attention side first (spec §4.4: LN1 and W_QKV, then W_O),
// then the FFN side (LN2, W_1, W_2). Gemma-3's post-attention norm belongs to the attention side;
// the FFN norm is applied right after W_O, so it travels with the FFN side and is waited for there.
struct Field {
  const float* LayerWeights::*vec = nullptr;
  cpu::WeightMatrix LayerWeights::*mat = nullptr;
};
const Field kAttnFields[] = {
    {&LayerWeights::attn_norm},
    {&LayerWeights::attn_norm_b},
    {nullptr, &LayerWeights::wq},
    {nullptr, &LayerWeights::wk},
    {nullptr, &LayerWeights::wv},
    {&LayerWeights::bq},
    {&LayerWeights::bk},
    {&LayerWeights::bv},
    {&LayerWeights::attn_q_norm},
    {&LayerWeights::attn_k_norm},
    {nullptr, &LayerWeights::wo},
    {&LayerWeights::bo},
    {&LayerWeights::post_attn_norm},
};
const Field kFfnFields[] = {
    {&LayerWeights::ffn_norm},    {&LayerWeights::ffn_norm_b},    {nullptr, &LayerWeights::gate},
    {nullptr, &LayerWeights::up}, {nullptr, &LayerWeights::down}, {&LayerWeights::b_up},
    {&LayerWeights::b_down},      {&LayerWeights::post_ffn_norm},
};

const uint8_t* get(const LayerWeights& L, const Field& f) {
  return f.vec != nullptr ? reinterpret_cast<const uint8_t*>(L.*f.vec) : (L.*f.mat).data;
}
void set(LayerWeights& L, const Field& f, const uint8_t* p) {
  if (f.vec != nullptr) {
    L.*f.vec = reinterpret_cast<const float*>(p);
  } else {
    (L.*f.mat).data = p;
    (L.*f.mat).lanes = nullptr;  // the staged bytes are GGUF rows
  }
}

struct TensorRef {
  const uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint64_t file_offset = 0;  // absolute, in the GGUF file
};

// Every layer's tensors, [layer][side] in transfer order.
using LayerTensors = std::vector<std::array<std::vector<TensorRef>, 2>>;

LayerTensors layer_tensors(const gguf::File& file, const ModelWeights& w) {
  std::unordered_map<const uint8_t*, const gguf::TensorInfo*> by_data;
  for (const gguf::TensorInfo& t : file.tensors()) by_data.emplace(t.data, &t);
  LayerTensors out(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    for (int side = 0; side < 2; ++side) {
      const std::span<const Field> fields = side == 0 ? std::span<const Field>(kAttnFields) : kFfnFields;
      for (const Field& f : fields) {
        const uint8_t* p = get(w.layers[l], f);
        if (p == nullptr) continue;
        const auto it = by_data.find(p);
        KVTIER_ASSERT(it != by_data.end(), "layer {}: a weight pointer outside the file's tensors", l);
        const gguf::TensorInfo& t = *it->second;
        out[l][static_cast<size_t>(side)].push_back({p, t.n_bytes, file.data_offset() + t.offset});
      }
    }
  }
  return out;
}

// Bytes of one slot for a layer: each tensor at a page-aligned offset; from the file, its extent
// widened to whole pages (O_DIRECT).
uint64_t slot_bytes_of(const std::array<std::vector<TensorRef>, 2>& t, policy::WeightSource src) {
  uint64_t cursor = 0;
  for (const auto& side : t) {
    for (const TensorRef& r : side) {
      cursor = align_up(cursor, kPage);
      cursor += src == policy::WeightSource::kFile
                    ? align_up(r.file_offset + r.bytes, kPage) - align_down(r.file_offset, kPage)
                    : r.bytes;
    }
  }
  return align_up(cursor, kPage);
}

policy::WeightPlan plan_of(const LayerTensors& lt, const ModelWeights& w, const WeightStreamOptions& o) {
  policy::WeightPlanInput in;
  in.budget = o.budget;
  uint64_t layers = 0;
  for (const auto& t : lt) {
    uint64_t b = 0;
    for (const auto& side : t)
      for (const TensorRef& r : side) b += r.bytes;
    in.layer_bytes.push_back(b);
    in.stage_bytes.push_back(slot_bytes_of(t, o.source));
    layers += b;
  }
  KVTIER_ASSERT(layers <= w.bytes, "layer tensors {} of {} bytes", layers, w.bytes);
  in.fixed_bytes = w.bytes - layers;
  return policy::plan_weights(in);
}

uint64_t host_copy_bytes(const LayerTensors& lt, uint32_t first) {
  uint64_t cursor = 0;
  for (size_t l = first; l < lt.size(); ++l)
    for (const auto& side : lt[l])
      for (const TensorRef& r : side) cursor = align_up(cursor, kHostAlign) + r.bytes;
  return cursor;
}

// The host copy of the streamed layers.
class HostWeightStore final : public kv::HomeStore {
 public:
  HostWeightStore(kv::MemoryLedger& ledger, uint64_t bytes)
      : reservation_(ledger, kv::Tier::kHost, kv::Category::kWeights, bytes),
        bytes_(std::max<uint64_t>(bytes, 1)) {
    data_ = static_cast<uint8_t*>(std::aligned_alloc(kPage, align_up(bytes_, kPage)));
    if (data_ == nullptr)
      fail(ErrorKind::kBudget, "cannot allocate {} bytes of host memory for weights", bytes_);
  }
  ~HostWeightStore() override { std::free(data_); }
  kv::Tier tier() const override { return kv::Tier::kHost; }
  uint64_t alignment() const override { return 1; }
  uint64_t size() const override { return bytes_; }
  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    std::memcpy(dst, data_ + offset, bytes);
  }
  void write(uint64_t, const uint8_t*, uint64_t) override {
    KVTIER_ASSERT(false, "the weights are read-only");
  }
  std::string describe() const override { return fmt::format("host memory ({} bytes of weights)", bytes_); }
  uint8_t* data() { return data_; }

 private:
  kv::Reservation reservation_;
  uint64_t bytes_;
  uint8_t* data_ = nullptr;
};

// The GGUF file itself, read with O_DIRECT where the file system allows it (else through the page
// cache, reported as direct_io false). Reads past the end of the file give zeros (the last
// tensor's extent is widened to whole pages).
class FileWeightStore final : public kv::HomeStore {
 public:
  FileWeightStore(kv::MemoryLedger& ledger, const std::string& path, uint64_t streamed_bytes)
      : reservation_(ledger, kv::Tier::kDisk, kv::Category::kWeights, streamed_bytes), path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    direct_ = fd_ >= 0;
    if (fd_ < 0) fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(ErrorKind::kIo, "{}: cannot open for weight streaming: {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(ErrorKind::kIo, "{}: fstat: {}", path, std::strerror(errno));
    size_ = align_up(static_cast<uint64_t>(st.st_size), kPage);
  }
  ~FileWeightStore() override { ::close(fd_); }
  kv::Tier tier() const override { return kv::Tier::kDisk; }
  uint64_t alignment() const override { return kPage; }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t r = ::pread(fd_, dst + done, bytes - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL && direct_) {  // the file system refused O_DIRECT after all
        reopen_buffered();
        continue;
      }
      if (r < 0)
        fail(ErrorKind::kIo, "{}: reading weights at {}: {}", path_, offset + done, std::strerror(errno));
      if (r == 0) {  // end of file: the rest of the page
        std::memset(dst + done, 0, bytes - done);
        break;
      }
      done += static_cast<uint64_t>(r);
    }
  }
  void write(uint64_t, const uint8_t*, uint64_t) override {
    KVTIER_ASSERT(false, "the weights are read-only");
  }
  std::string describe() const override {
    return fmt::format("{} ({})", path_, direct_ ? "O_DIRECT" : "page cache: O_DIRECT refused");
  }
  bool direct() const { return direct_; }

 private:
  void reopen_buffered() {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorKind::kIo, "{}: reopening without O_DIRECT: {}", path_, std::strerror(errno));
    ::close(fd_);
    fd_ = fd;
    direct_ = false;
  }
  kv::Reservation reservation_;
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> direct_{false};
  uint64_t size_ = 0;
};

}  // namespace

WeightFootprint weight_footprint(const gguf::File& file, const ModelWeights& w,
                                 const WeightStreamOptions& o) {
  const LayerTensors lt = layer_tensors(file, w);
  WeightFootprint f;
  f.plan = plan_of(lt, w, o);
  f.device_bytes = f.plan.device_bytes() + w.lanes_extra_bytes;
  if (f.plan.streams()) {
    if (o.source == policy::WeightSource::kHost) {
      f.host_bytes = host_copy_bytes(lt, f.plan.resident_layers);
    } else {
      f.disk_bytes = f.plan.streamed_bytes;
    }
  }
  return f;
}

WeightStreamer::WeightStreamer(const gguf::File& file, const ModelWeights& w, const WeightStreamOptions& o,
                               kv::MemoryLedger& ledger)
    : w_(w), opt_(o) {
  const LayerTensors lt = layer_tensors(file, w);
  plan_ = plan_of(lt, w, o);
  device_ = kv::Reservation(ledger, kv::Tier::kDevice, kv::Category::kWeights,
                            plan_.device_bytes() + w.lanes_extra_bytes);
  layers_.resize(w.layers.size());
  if (!plan_.streams()) return;
  const uint32_t first = plan_.resident_layers;
  // The home of the streamed layers and each copy's source offset in it.
  uint64_t host_cursor = 0;
  HostWeightStore* host = nullptr;
  if (o.source == policy::WeightSource::kHost) {
    auto h = std::make_unique<HostWeightStore>(ledger, host_copy_bytes(lt, first));
    host = h.get();
    home_ = std::move(h);
  } else {
    home_ = std::make_unique<FileWeightStore>(ledger, file.path(), plan_.streamed_bytes);
  }
  size_t max_copies = 1;
  for (uint32_t l = first; l < lt.size(); ++l) {
    LayerPlan& lp = layers_[l];
    uint64_t cursor = 0;
    for (size_t side = 0; side < 2; ++side) {
      for (const TensorRef& r : lt[l][side]) {
        cursor = align_up(cursor, kPage);
        if (host != nullptr) {
          host_cursor = align_up(host_cursor, kHostAlign);
          std::memcpy(host->data() + host_cursor, r.data, r.bytes);
          lp.parts[side].push_back({host_cursor, cursor, r.bytes});
          lp.remap.emplace_back(r.data, cursor);
          host_cursor += r.bytes;
          cursor += r.bytes;
        } else {
          const uint64_t s0 = align_down(r.file_offset, kPage);
          const uint64_t n = align_up(r.file_offset + r.bytes, kPage) - s0;
          lp.parts[side].push_back({s0, cursor, n});
          lp.remap.emplace_back(r.data, cursor + (r.file_offset - s0));
          cursor += n;
        }
      }
      max_copies = std::max(max_copies, lp.parts[side].size());
    }
    KVTIER_ASSERT(align_up(cursor, kPage) <= plan_.staging_bytes / 2, "layer {}: {} bytes in a slot of {}", l,
                  cursor, plan_.staging_bytes / 2);
  }
  slot_bytes_ = plan_.staging_bytes / 2;
  staging_ = static_cast<uint8_t*>(std::aligned_alloc(kPage, plan_.staging_bytes));
  if (staging_ == nullptr)
    fail(ErrorKind::kBudget, "cannot allocate {} bytes of weight staging", plan_.staging_bytes);
  slots_[0].base = staging_;
  slots_[1].base = staging_ + slot_bytes_;
  kv::LinkLimit link;
  link.bytes_per_s = o.link_bytes_per_s;
  engine_ = std::make_unique<kv::TransferEngine>(*home_, kPinBlock, 4, max_copies, 0, link);
}

WeightStreamer::~WeightStreamer() {
  if (engine_ != nullptr) {
    try {
      engine_->drain();
    } catch (...) {  // a failed load was reported to the pass that waited on it
    }
  }
  engine_.reset();
  std::free(staging_);
}

uint32_t WeightStreamer::next_streamed(uint32_t l) const {
  const auto n = static_cast<uint32_t>(w_.layers.size());
  return l + 1 < n ? l + 1 : plan_.resident_layers;
}

void WeightStreamer::issue(uint32_t layer, Slot& s) {
  const LayerPlan& lp = layers_[layer];
  s.layer = layer;
  s.view = w_.layers[layer];
  for (const Field& f : kAttnFields) {
    if (const uint8_t* p = get(s.view, f); p != nullptr) {
      for (const auto& [data, off] : lp.remap)
        if (data == p) set(s.view, f, s.base + off);
    }
  }
  for (const Field& f : kFfnFields) {
    if (const uint8_t* p = get(s.view, f); p != nullptr) {
      for (const auto& [data, off] : lp.remap)
        if (data == p) set(s.view, f, s.base + off);
    }
  }
  for (int side = 0; side < 2; ++side) {
    std::vector<kv::BlockCopy> copies;
    copies.reserve(lp.parts[side].size());
    for (const Copy& c : lp.parts[side]) copies.push_back({c.src, s.base + c.dst, c.bytes});
    s.tickets[side] = engine_->prepare(kv::CopyDir::kLoad, copies);
    s.waited[side] = false;
  }
  ++layer_loads_;
}

const LayerWeights& WeightStreamer::begin_layer(uint32_t l) {
  KVTIER_ASSERT(l < w_.layers.size(), "layer {}", l);
  current_ = l;
  current_slot_ = -1;
  if (!plan_.streams()) return w_.layers[l];
  // The two streamed layers computed next, starting at l.
  const uint32_t u0 = l >= plan_.resident_layers ? l : plan_.resident_layers;
  const uint32_t u1 = next_streamed(u0);
  for (const uint32_t u : {u0, u1}) {
    if (slots_[0].layer == u || slots_[1].layer == u) continue;
    const auto keep = [&](const Slot& s) {
      return s.layer == static_cast<int64_t>(u0) || s.layer == static_cast<int64_t>(u1);
    };
    Slot& s = !keep(slots_[0]) ? slots_[0] : slots_[1];
    KVTIER_ASSERT(!keep(s), "no free weight slot for layer {}", u);
    issue(u, s);
  }
  if (l < plan_.resident_layers) return w_.layers[l];
  current_slot_ = slots_[0].layer == l ? 0 : 1;
  Slot& s = slots_[current_slot_];
  KVTIER_ASSERT(s.layer == l, "layer {} is not staged", l);
  if (!s.waited[0]) {
    engine_->wait(s.tickets[0]);
    s.waited[0] = true;
  }
  return s.view;
}

void WeightStreamer::ffn_ready(uint32_t l) {
  KVTIER_ASSERT(static_cast<int64_t>(l) == current_, "ffn_ready({}) while computing layer {}", l, current_);
  if (current_slot_ < 0) return;
  Slot& s = slots_[current_slot_];
  if (!s.waited[1]) {
    engine_->wait(s.tickets[1]);
    s.waited[1] = true;
  }
}

const LayerWeights& WeightStreamer::current(uint32_t l) const {
  if (!plan_.streams() || l < plan_.resident_layers) return w_.layers[l];
  KVTIER_ASSERT(static_cast<int64_t>(l) == current_ && current_slot_ >= 0 && slots_[current_slot_].waited[0],
                "the weights of layer {} are not staged (computing layer {})", l, current_);
  return slots_[current_slot_].view;
}

WeightStreamStats WeightStreamer::stats() const {
  WeightStreamStats s;
  s.resident_layers = plan_.resident_layers;
  s.streamed_layers = static_cast<uint32_t>(w_.layers.size()) - plan_.resident_layers;
  s.resident_bytes = plan_.resident_bytes;
  s.staging_bytes = plan_.staging_bytes;
  s.streamed_bytes = plan_.streamed_bytes;
  s.layer_loads = layer_loads_;
  s.source = opt_.source;
  if (engine_ != nullptr) {
    const kv::TransferStats t = engine_->stats();
    s.bytes_loaded = t.bytes_loaded;
    s.wait_seconds = t.wait_seconds;
  }
  if (const auto* f = dynamic_cast<const FileWeightStore*>(home_.get())) s.direct_io = f->direct();
  return s;
}

}  // namespace kvtier::model
