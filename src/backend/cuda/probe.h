// Measured link bandwidth of this machine: pinned host <-> device cudaMemcpyAsync on the H2D and D2H
// streams, timed with events (the figure the planner and the decode bound of issue 7 use).
#pragma once

#include <cstddef>

namespace kvtier::cuda {

class Context;

struct CopyBandwidth {
  size_t bytes = 0;        // per copy
  int reps = 0;            // copies timed per direction
  double h2d_gib_s = 0.0;  // median over the reps
  double d2h_gib_s = 0.0;
};

// Times `reps` copies of `bytes` each way between the context's pinned pool and its arena (both
// carved temporarily and released). Synchronises its own streams: not for the layer loop.
CopyBandwidth measure_copy_bandwidth(Context& ctx, size_t bytes, int reps);

// The same measure with buffers of its own (cudaMalloc, cudaHostAlloc) and a stream of its own on
// `device`, all freed before it returns: for a probe before a session takes the device's memory.
CopyBandwidth measure_copy_bandwidth(int device, size_t bytes, int reps);

}  // namespace kvtier::cuda
