#include "backend/cuda/stream.h"

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace kvtier::cuda {

Stream::Stream(StreamPriority priority) {
  int least = 0, greatest = 0;
  KVTIER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int p = priority == StreamPriority::kHigh ? greatest : least;
  KVTIER_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, p));
}

Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const {
  KVTIER_CUDA_CHECK(cudaStreamSynchronize(s_));
}

Event::Event(EventTiming timing) {
  const unsigned flags = timing == EventTiming::kOn ? cudaEventDefault : cudaEventDisableTiming;
  KVTIER_CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags));
}

Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  KVTIER_CUDA_CHECK(cudaEventRecord(e_, stream));
}

void Event::wait_on(cudaStream_t stream) const {
  KVTIER_CUDA_CHECK(cudaStreamWaitEvent(stream, e_, 0));
}

bool Event::done() const {
  const cudaError_t st = cudaEventQuery(e_);
  if (st == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    return false;
  }
  KVTIER_CUDA_CHECK(st);
  return true;
}

void Event::synchronize() const {
  KVTIER_CUDA_CHECK(cudaEventSynchronize(e_));
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0.0f;
  KVTIER_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, end.e_));
  return ms;
}

}  // namespace kvtier::cuda
