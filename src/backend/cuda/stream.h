// RAII CUDA streams and events, and the three streams of the engine: compute, host-to-device and
// device-to-host. Work is ordered across streams with events (record on one, wait on another),
// never with a device-wide synchronisation.
#pragma once

#include <cuda_runtime_api.h>

namespace kvtier::cuda {

enum class StreamPriority { kNormal, kHigh };

class Stream {
 public:
  // Non-blocking with respect to the legacy default stream. kHigh: the device's greatest priority
  // (its kernels' blocks are scheduled before those of normal streams; copies are unaffected).
  explicit Stream(StreamPriority priority = StreamPriority::kNormal);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;

  cudaStream_t get() const { return s_; }
  void synchronize() const;  // waits for this stream only (not for a hot path)

 private:
  cudaStream_t s_ = nullptr;
};

enum class EventTiming { kOff, kOn };

class Event {
 public:
  explicit Event(EventTiming timing = EventTiming::kOff);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;

  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t stream);
  void wait_on(cudaStream_t stream) const;  // makes `stream` wait for this event
  bool done() const;                        // cudaEventQuery: true once the recorded work finished
  void synchronize() const;
  // Milliseconds between two timing events (both recorded and done).
  static float elapsed_ms(const Event& start, const Event& end);

 private:
  cudaEvent_t e_ = nullptr;
};

// The engine's streams: kernels on compute, uploads on h2d, write-backs on d2h. The copy streams
// have the high priority: InfiniGen's gather kernel on h2d then gets SM slots as soon as blocks of
// the compute kernels retire, instead of waiting for a whole compute kernel.
struct Streams {
  Stream compute;
  Stream h2d{StreamPriority::kHigh};
  Stream d2h{StreamPriority::kHigh};
};

}  // namespace kvtier::cuda
