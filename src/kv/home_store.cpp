#include "kv/home_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include <fmt/format.h>
#if KVTIER_HAVE_LIBURING
#include <liburing.h>
#endif

#include "core/align.h"
#include "core/error.h"
#include "kv/page_extents.h"

namespace kvtier::kv {
namespace {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};

class HostStore final : public HomeStore {
 public:
  HostStore(MemoryLedger& ledger, uint64_t bytes)
      : reservation_(ledger, Tier::kHost, Category::kKv, bytes), size_(bytes) {
    const uint64_t alloc = (bytes + 63) / 64 * 64;
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(64, alloc == 0 ? 64 : alloc)));
    if (!data_) fail(ErrorKind::kBudget, "cannot allocate {} bytes of host memory for the KV cache", bytes);
  }
  Tier tier() const override { return Tier::kHost; }
  uint64_t alignment() const override { return 1; }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    KVTIER_ASSERT(offset + bytes <= size_);
    std::memcpy(dst, data_.get() + offset, bytes);
  }
  void write(uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    KVTIER_ASSERT(offset + bytes <= size_);
    std::memcpy(data_.get() + offset, src, bytes);
  }
  std::string describe() const override { return fmt::format("host DRAM, {} bytes", size_); }

 private:
  Reservation reservation_;
  uint64_t size_;
  std::unique_ptr<uint8_t, AlignedFree> data_;
};

class DiskStore final : public HomeStore {
 public:
  DiskStore(MemoryLedger& ledger, const std::string& dir, uint64_t bytes, const DiskFaults& faults)
      : reservation_(ledger, Tier::kDisk, Category::kKv, bytes), dir_(dir), faults_(faults) {
    size_ = round_up(bytes, kDirectIoAlign);
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      fail(ErrorKind::kInvalidArgument, "--kv-disk {}: not a directory", dir);
    }
    fd_ = open_unnamed(O_DIRECT);
    direct_ = fd_ >= 0;
    if (fd_ < 0) fd_ = open_unnamed(0);  // file systems without O_DIRECT (tmpfs): buffered I/O
    if (fd_ < 0) fail(ErrorKind::kIo, "--kv-disk {}: cannot create a file: {}", dir, std::strerror(errno));
    const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size_));
    if (rc != 0) {
      ::close(fd_);
      fd_ = -1;
      fail(ErrorKind::kBudget, "--kv-disk {}: cannot reserve {} bytes for the KV cache: {}", dir, size_,
           std::strerror(rc));
    }
    open_ring();
  }
  ~DiskStore() override {
#if KVTIER_HAVE_LIBURING
    if (ring_open_) io_uring_queue_exit(&ring_);
#endif
    if (fd_ >= 0) ::close(fd_);
  }
  Tier tier() const override {
    return Tier::kDisk;
  }
  uint64_t alignment() const override {
    return direct_ ? kDirectIoAlign : 1;
  }
  uint64_t size() const override {
    return size_;
  }

  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    KVTIER_ASSERT(offset + bytes <= size_);
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t r = ::pread(fd_, dst + done, bytes - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fail(ErrorKind::kIo, "KV disk tier in {}: read of {} bytes at {} failed: {}", dir_, bytes, offset,
             r == 0 ? "unexpected end of file" : std::strerror(errno));
      }
      done += static_cast<uint64_t>(r);
    }
  }

  void read_batch(std::span<const BlockCopy> reads) override {
#if KVTIER_HAVE_LIBURING
    if (ring_ok_ && reads.size() > 1) {
      read_ring(reads);
      return;
    }
#endif
    for (const BlockCopy& r : reads) read(r.home_offset, r.buf, r.bytes);
  }
  uint32_t queue_depth() const override {
    return ring_ok_ ? kDiskQueueDepth : 1;
  }
  uint64_t gather_gap() const override {
    return ring_ok_ ? kDiskGatherGap : kDiskGatherGapSerial;
  }

  void write(uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    KVTIER_ASSERT(offset + bytes <= size_);
    if (written_ + bytes > faults_.fail_after_bytes) {
      fail(ErrorKind::kIo, "KV disk tier in {}: write of {} bytes at {} failed: {} (injected)", dir_, bytes,
           offset, std::strerror(faults_.error));
    }
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t r = ::pwrite(fd_, src + done, bytes - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fail(ErrorKind::kIo, "KV disk tier in {}: write of {} bytes at {} failed: {}", dir_, bytes, offset,
             r == 0 ? "no progress" : std::strerror(errno));
      }
      done += static_cast<uint64_t>(r);
    }
    written_ += bytes;
  }

  std::string describe() const override {
    return fmt::format(
        "disk file in {}, {} bytes, {}, {}", dir_, size_, direct_ ? "O_DIRECT" : "buffered I/O",
        ring_ok_ ? fmt::format("io_uring reads (queue depth {})", kDiskQueueDepth) : ring_note_);
  }

 private:
  void open_ring() {
#if KVTIER_HAVE_LIBURING
    const int rc = io_uring_queue_init(kDiskQueueDepth, &ring_, 0);
    ring_ok_ = ring_open_ = rc == 0;
    if (!ring_ok_) ring_note_ = fmt::format("reads one by one (io_uring: {})", std::strerror(-rc));
    pending_.resize(kDiskQueueDepth);
    free_.reserve(kDiskQueueDepth);
#else
    ring_note_ = "reads one by one (built without liburing)";
#endif
  }

#if KVTIER_HAVE_LIBURING
  // The part of one copy still to read; a short read continues from where it stopped.
  struct Pending {
    uint64_t offset = 0;
    uint8_t* dst = nullptr;
    uint64_t left = 0;
  };

  void queue_read(uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    KVTIER_ASSERT(sqe != nullptr, "io_uring submission queue full with {} reads in flight", kDiskQueueDepth);
    const Pending& p = pending_[slot];
    // One read moves at most 1 GiB (a multiple of the direct-I/O alignment); the rest is queued again.
    const auto n = static_cast<unsigned>(std::min<uint64_t>(p.left, uint64_t{1} << 30));
    io_uring_prep_read(sqe, fd_, p.dst, n, p.offset);
    io_uring_sqe_set_data64(sqe, slot);
  }

  // Up to kDiskQueueDepth reads in flight; on an error, the reads in flight finish before it is thrown
  // (the device must not write into buffers the caller may reuse).
  void read_ring(std::span<const BlockCopy> reads) {
    free_.clear();
    for (uint32_t i = kDiskQueueDepth; i-- > 0;) free_.push_back(i);
    size_t next = 0;
    uint32_t in_flight = 0;
    std::string error;
    for (;;) {
      while (error.empty() && next < reads.size() && !free_.empty()) {
        const BlockCopy& r = reads[next++];
        KVTIER_ASSERT(r.home_offset + r.bytes <= size_);
        if (r.bytes == 0) continue;
        const uint32_t slot = free_.back();
        free_.pop_back();
        pending_[slot] = {r.home_offset, r.buf, r.bytes};
        queue_read(slot);
        ++in_flight;
      }
      if (in_flight == 0) break;
      const int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // Nothing more can be submitted: wait for the reads the kernel took already, then report.
        if (error.empty()) error = fmt::format("io_uring submit: {}", std::strerror(-rc));
        in_flight -= io_uring_sq_ready(&ring_);
        ring_ok_ = false;  // (its unsubmitted entries must never go out): later batches use pread
        io_uring_cqe* cqe = nullptr;
        while (in_flight > 0 && io_uring_wait_cqe(&ring_, &cqe) == 0) {
          io_uring_cqe_seen(&ring_, cqe);
          --in_flight;
        }
        break;
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        const auto slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
        Pending& p = pending_[slot];
        const int res = cqe->res;
        if (res == -EINTR || res == -EAGAIN) {  // no progress: the same read again
          if (error.empty()) {
            queue_read(slot);
            continue;
          }
        } else if (res > 0 && error.empty()) {
          p.offset += static_cast<uint64_t>(res);
          p.dst += res;
          p.left -= static_cast<uint64_t>(res);
          if (p.left > 0) {  // a short read: the rest
            queue_read(slot);
            continue;
          }
        } else if (error.empty()) {
          error = fmt::format("read of {} bytes at {} failed: {}", p.left, p.offset,
                              res == 0 ? "unexpected end of file" : std::strerror(-res));
        }
        free_.push_back(slot);
        --in_flight;
      }
      io_uring_cq_advance(&ring_, seen);
    }
    if (!error.empty()) fail(ErrorKind::kIo, "KV disk tier in {}: {}", dir_, error);
  }

  io_uring ring_{};
  std::vector<Pending> pending_;  // [kDiskQueueDepth] by slot (the reads' user data)
  std::vector<uint32_t> free_;    // [kDiskQueueDepth] slots not in flight
#endif

  int open_unnamed(int extra) {
    int fd = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | extra, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != ENOENT)) return fd;
    // No O_TMPFILE: create a uniquely named file and unlink it at once.
    std::random_device rd;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const std::string path = fmt::format("{}/.kvtier-kv-{:016x}", dir_, (uint64_t{rd()} << 32) | rd());
      fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | extra, 0600);
      if (fd >= 0) {
        ::unlink(path.c_str());
        return fd;
      }
      if (errno != EEXIST) return -1;
    }
    return -1;
  }

  Reservation reservation_;
  std::string dir_;
  DiskFaults faults_;
  uint64_t size_ = 0;
  uint64_t written_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  bool ring_open_ = false;  // the io_uring exists (closed in the destructor)
  bool ring_ok_ = false;    // read_batch() goes through it
  std::string ring_note_;   // why not, for describe()
};

}  // namespace

bool disk_io_uring_built() {
  return KVTIER_HAVE_LIBURING != 0;
}

std::unique_ptr<HomeStore> make_host_store(MemoryLedger& ledger, uint64_t bytes) {
  return std::make_unique<HostStore>(ledger, bytes);
}

std::unique_ptr<HomeStore> make_disk_store(MemoryLedger& ledger, const std::string& dir, uint64_t bytes,
                                           const DiskFaults& faults) {
  return std::make_unique<DiskStore>(ledger, dir, bytes, faults);
}

}  // namespace kvtier::kv
