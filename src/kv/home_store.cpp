#include "kv/home_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "core/error.h"

namespace kvtier::kv {
namespace {

constexpr uint64_t kDirectAlign = 4096;

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
    size_ = (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
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
  }
  ~DiskStore() override {
    if (fd_ >= 0) ::close(fd_);
  }
  Tier tier() const override { return Tier::kDisk; }
  uint64_t alignment() const override { return direct_ ? kDirectAlign : 1; }
  uint64_t size() const override { return size_; }

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
    return fmt::format("disk file in {}, {} bytes, {}", dir_, size_, direct_ ? "O_DIRECT" : "buffered I/O");
  }

 private:
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
};

}  // namespace

std::unique_ptr<HomeStore> make_host_store(MemoryLedger& ledger, uint64_t bytes) {
  return std::make_unique<HostStore>(ledger, bytes);
}

std::unique_ptr<HomeStore> make_disk_store(MemoryLedger& ledger, const std::string& dir, uint64_t bytes,
                                           const DiskFaults& faults) {
  return std::make_unique<DiskStore>(ledger, dir, bytes, faults);
}

}  // namespace kvtier::kv
