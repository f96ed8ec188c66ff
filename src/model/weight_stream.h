// Weight streaming (HybridServe's weight offloading, spec hybridserve.md §4.4): the decoder layers
// that policy::plan_weights leaves out of compute-local memory are copied, on every pass, from their
// home (a host-memory copy, or the GGUF file itself with O_DIRECT where the file system allows it)
// into one of two staging slots, layer l+1 while layer l computes. A layer's attention-side tensors
// (LN1, W_Q, W_K, W_V, W_O and their biases) travel as one job and its FFN-side tensors as a second,
// so the attention can start before the FFN weights have arrived. The bytes are the file's own, so
// the forward pass computes the same bits as with resident weights.
//
// Ledger: (device, weights) = the resident weights and the two slots; (host, weights) = the host
// copy of the streamed layers; (disk, weights) = the streamed layers read from the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/reader.h"
#include "kv/ledger.h"
#include "kv/transfer_engine.h"
#include "model/config.h"
#include "model/weights.h"
#include "policy/weight_plan.h"

namespace kvtier::model {

struct WeightStreamOptions {
  uint64_t budget = 0;  // --weights-mem: compute-local bytes for weights; 0 = all resident
  policy::WeightSource source = policy::WeightSource::kHost;
  double link_bytes_per_s = 0;  // --link-gbps: paces the weight loads too (0 = not paced)
};

// What a WeightStreamer with these options reserves, per tier (predict_memory uses it).
struct WeightFootprint {
  policy::WeightPlan plan;
  uint64_t device_bytes = 0;  // resident weights + two staging slots + the layers' lanes copies
  uint64_t host_bytes = 0;    // kHost: the host copy of the streamed layers (32-byte aligned tensors)
  uint64_t disk_bytes = 0;    // kFile: the streamed layers' bytes in the file
};
WeightFootprint weight_footprint(const gguf::File& file, const ModelWeights& w, const WeightStreamOptions& o);

struct WeightStreamStats {
  uint32_t resident_layers = 0;
  uint32_t streamed_layers = 0;
  uint64_t resident_bytes = 0;  // compute-local, including the weights outside the layers
  uint64_t staging_bytes = 0;   // the two slots
  uint64_t streamed_bytes = 0;  // bytes of the streamed layers (their home's size)
  uint64_t bytes_loaded = 0;    // copied into the slots so far
  uint64_t layer_loads = 0;
  double wait_seconds = 0;  // the compute thread blocked on weight loads
  bool direct_io = false;   // kFile: the file is read with O_DIRECT
  policy::WeightSource source = policy::WeightSource::kHost;
};

class WeightStreamer {
 public:
  // Throws Error(kBudget) when the budget cannot hold the fixed weights and two slots, Error(kIo)
  // when the file cannot be opened.
  WeightStreamer(const gguf::File& file, const ModelWeights& w, const WeightStreamOptions& o,
                 kv::MemoryLedger& ledger);
  ~WeightStreamer();
  WeightStreamer(const WeightStreamer&) = delete;
  WeightStreamer& operator=(const WeightStreamer&) = delete;

  bool streams() const { return plan_.streams(); }
  const policy::WeightPlan& plan() const { return plan_; }

  // Start of layer l's compute: makes sure l and the next streamed layer (in pass order, wrapping to
  // the next pass) are loading, waits for l's attention-side tensors and returns its weights (the
  // resident ones, or the staged view). The FFN-side pointers are valid after ffn_ready(l).
  const LayerWeights& begin_layer(uint32_t l);
  void ffn_ready(uint32_t l);
  // The weights of the layer being computed (for the KV compute hook); asserts that l is that layer.
  const LayerWeights& current(uint32_t l) const;

  WeightStreamStats stats() const;

 private:
  struct Copy {
    uint64_t src = 0;  // offset in the home store
    uint64_t dst = 0;  // offset in a slot
    uint64_t bytes = 0;
  };
  struct LayerPlan {
    std::vector<Copy> parts[2];                              // attention-side, FFN-side
    std::vector<std::pair<const uint8_t*, uint64_t>> remap;  // tensor data pointer -> its offset in a slot
  };
  struct Slot {
    int64_t layer = -1;
    kv::TransferEngine::Ticket tickets[2] = {0, 0};
    bool waited[2] = {false, false};
    LayerWeights view;
    uint8_t* base = nullptr;
  };
  void issue(uint32_t layer, Slot& s);
  uint32_t next_streamed(uint32_t l) const;  // the first streamed layer after l, wrapping

  const ModelWeights& w_;
  policy::WeightPlan plan_;
  WeightStreamOptions opt_;
  std::vector<LayerPlan> layers_;  // [n_layer] (empty for resident layers)
  std::unique_ptr<kv::HomeStore> home_;
  std::unique_ptr<kv::TransferEngine> engine_;
  uint8_t* staging_ = nullptr;  // [2, slot_bytes] aligned to 4096
  uint64_t slot_bytes_ = 0;
  Slot slots_[2];
  int64_t current_ = -1;  // layer being computed
  int current_slot_ = -1;
  uint64_t layer_loads_ = 0;
  kv::Reservation device_;
};

}  // namespace kvtier::model
