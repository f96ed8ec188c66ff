// The KVPR profiler (spec kvpr.md §4 on the CPU): measures what the split-point scheduler needs on
// this machine for one model —
//   - the home tier's link: bytes per second that load jobs of the transfer engine move from a host
//     DRAM home tier (a memory copy), and from a disk home tier (O_DIRECT reads where the file system
//     has them), into compute-local staging, at one layer's K,V of a long context per job;
//   - the K/V projection rate: cpu::matmul of one layer's wk and wv over a batch of tokens (what
//     recomputing K,V from stored activation rows costs), in FLOP/s and tokens/s;
//   - a decode step's weight pass: cpu::matmul of one token through every weight matrix a decode step
//     multiplies (what the scheduler's pipelined model hides a load behind before a decode step has
//     been timed; see policy::kvpr_hidden_estimate).
// Settings follow FlexGen's profile_bandwidth: 3 warm-up copies, then 3 timed repeats of 5 copies;
// the rate is bytes over the median repeat. The result is keyed (ProfileKey) so it can be cached
// (profile_cache.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "policy/kvpr_schedule.h"
#include "runtime/model_files.h"

namespace kvtier::runtime {

// What a profile was measured for. Two profiles with equal keys are interchangeable.
struct ProfileKey {
  std::string model_hash;  // 16 hex digits over the architecture and the weight matrices' shapes and
                           // types (what the measured speeds depend on; weight values do not matter)
  std::string cpu;         // CPU brand string
  std::string isa;         // the kernel path (scalar | avx2 | avx512)
  int threads = 0;
  std::string disk_dir;         // directory of the disk home tier profiled; empty: none
  double link_bytes_per_s = 0;  // the link throttle in force (--link-gbps); 0: none
  bool operator==(const ProfileKey&) const = default;
};

struct LinkMeasurement {
  double bytes_per_s = 0;
  uint64_t job_bytes = 0;  // bytes of one copy job
  int copies = 0;          // copy jobs per timed repeat
  double median_s = 0;     // median time of a repeat
};

struct Profile {
  ProfileKey key;
  LinkMeasurement host;                 // host DRAM home tier -> staging
  std::optional<LinkMeasurement> disk;  // disk home tier -> staging (when a directory was given)
  std::string disk_io;                  // how the disk tier moved bytes ("O_DIRECT", "buffered I/O")
  double proj_flops_per_s = 0;          // K and V projections of one layer
  double proj_tokens_per_s = 0;         // tokens whose K and V one layer projects per second
  int64_t proj_tokens = 0;              // tokens per timed projection
  // Median seconds of one token through every matrix a decode step multiplies (each layer's wq, wk,
  // wv, wo, gate, up, down, and the output head): the weight-read-bound matvecs that are most of a
  // decode step's compute. 0 in cache entries written before it was measured (then unused).
  double decode_weights_s = 0;
  // Per token and layer of this model: K and V bytes (f16 rows), the activation row(s) recompute
  // consumes (the quantised rows cpu::matmul makes, f32 when wk and wv want different formats),
  // and the FLOPs of recomputing K and V.
  double kv_bytes_per_token = 0;
  double x_bytes_per_token = 0;
  double proj_flops_per_token = 0;
};

struct ProfileOptions {
  int threads = 1;
  cpu::Isa isa = cpu::Isa::kScalar;
  std::string disk_dir;            // empty: the disk tier is not profiled
  double link_bytes_per_s = 0;     // throttle the transfer engine's loads (0: no throttle)
  int64_t transfer_tokens = 4096;  // a copy job moves one layer's K,V at this many tokens (≤ 16 MiB)
  int64_t proj_tokens = 256;       // tokens per timed projection
};

ProfileKey profile_key(const LoadedModel& m, const ProfileOptions& o);
// Measures (a few tenths of a second on small models, more with a disk tier).
Profile measure_profile(const LoadedModel& m, const ProfileOptions& o);

// The scheduler's cost terms for one sequence from a profile, over the host or the disk link (throws
// Error(kInvalidArgument) if the disk link was not profiled).
policy::KvprCosts kvpr_costs(const Profile& p, bool disk);

}  // namespace kvtier::runtime
