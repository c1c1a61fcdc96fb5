// Internal (not installed): the checkpoint layer's file access. Every error is an IoError naming
// the file, the offset where it matters, and the system's reason. Files are opened without
// following symlinks, so a link planted in a checkpoint cannot redirect a read or a write.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "tessel/checkpoint/detail/io/byte_source.h"
#include "tessel/runtime/detail/allocation.h"

namespace tessel::detail {

class File final : public ByteSource {
 public:
  // A regular file, read-only. Throws IoError if it is missing, a symlink or not a regular file.
  static File open_read(const std::filesystem::path& path);
  // A new or truncated file, write-only (never through a symlink).
  static File create(const std::filesystem::path& path);
  // An existing regular file, write-only, kept as it is (another writer's parts of it stay).
  static File open_write(const std::filesystem::path& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() override;

  const std::filesystem::path& path() const { return path_; }
  int64_t size() const override;
  std::string where() const override { return path_.string(); }
  int64_t read_unit() const override { return int64_t{1} << 20; }
  // Exactly out.size() bytes at `offset`; a short file is an IoError ("truncated").
  void read_exact(int64_t offset, std::span<std::byte> out) const override;
  // One contiguous file range into several buffers (preadv), exactly their total size.
  void read_scatter(int64_t offset, std::span<const iovec> buffers) const override;
  // Asks the kernel to start reading [offset, offset + size) into the page cache and returns
  // without waiting (posix_fadvise WILLNEED): a reader hints its next range so the disk always has
  // requests queued. A hint only: failures are ignored.
  void will_need(int64_t offset, int64_t size) const noexcept override;
  // [offset, offset + size) mapped private and writable (copy-on-write), its pages not yet read
  // in; nullopt where it cannot be: an offset not 64-byte aligned (a Buffer's alignment), a range
  // past the file's end, or a system that refuses. For restore, where the bytes of a chunk already
  // are a device's block: the page cache's pages become the block, with no copy and no fresh memory.
  std::optional<MappedBytes> map(int64_t offset, int64_t size) const override;
  // Reads [offset, offset + size) into the page cache and returns once it is there: sequential
  // read()s of 128 KiB into a small scratch buffer, the bytes discarded. For a mapped restore of
  // bytes not yet cached: the kernel's readahead for read() keeps more of the disk busy than the
  // page faults of MADV_POPULATE_READ after MADV_WILLNEED (16 MiB chunk files, 4 threads, 6 cold
  // rounds: median 1.67 GB/s against 1.36). A hint only: errors and a short file end it quietly,
  // populate() reports them.
  void read_into_cache(int64_t offset, int64_t size) const noexcept override;
  // The same, placed at `at`: a page boundary inside a range from reserve_mapping that the caller
  // owns (MAP_FIXED replaces what is there), so that the chunks of one block lie side by side.
  // false where it cannot be: an offset not on a page boundary, a range past the file's end, or a
  // system that refuses.
  bool map_into(std::byte* at, int64_t offset, int64_t size) const override;
  void write_all(std::span<const std::byte> data);
  // All of `data` at `offset` (pwrite): threads may write disjoint ranges of one file at once.
  // After enable_direct_writes, a large part on the file system's direct-I/O alignment goes
  // around the page cache (see there); the rest, and everything otherwise, is buffered.
  void write_at(int64_t offset, std::span<const std::byte> data) const;
  // Opens a second descriptor with O_DIRECT for write_at, where the file system reports direct
  // I/O (statx STATX_DIOALIGN); false, changing nothing, where it does not or refuses. For durable
  // saves, whose bytes must reach the disk anyway: a buffered write copies them into fresh
  // page-cache pages the kernel first zeroes, and that, not the disk, bounded a save here (2 GiB
  // from 2 threads: 1.55 to 1.86 GB/s direct against 0.80 to 1.00 buffered + fsync, dd, 3 runs
  // each). Its bytes then are not in the page cache: a later restore reads the disk.
  bool enable_direct_writes();
  bool direct_writes() const { return direct_fd_ >= 0; }
  // Starts writing [offset, offset + size) to the disk without waiting for it
  // (sync_file_range(SYNC_FILE_RANGE_WRITE)): the disk gets a writer's part of a shared file while
  // the writers go on, and the final sync() has less left to do. Durability is sync()'s job.
  // Waiting here for each part (as this did until 2026-11-26) kept the disk's queue shallow: an
  // OCDBT save of 2 GiB in 16 MiB values with 4 writers ran 1.25x faster without the wait (6
  // alternating runs on the project's VM), at or above a raw write + fsync of the same bytes.
  void start_writeback(int64_t offset, int64_t size) const;
  void resize(int64_t size) const;  // ftruncate: grows with zeros or cuts
  void sync();   // fsync
  void close();  // reports a failing close (a deferred write error) as IoError

 private:
  File(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  // A second descriptor of this file with `flags` (and O_NOFOLLOW, O_CLOEXEC), opened by its path
  // and checked to be the same file (nothing replaced it between); -1 where it cannot be.
  int reopen(int flags) const;
  // The direct part of write_at: at most `data`'s whole units from `offset`, when the offset,
  // the address and the size allow it; returns how many bytes it wrote (0: none, write buffered).
  size_t write_direct(int64_t offset, std::span<const std::byte> data) const;
  int fd_ = -1;
  std::filesystem::path path_;
  int direct_fd_ = -1;
  int64_t direct_unit_ = 0;       // offsets and sizes of direct writes: multiples of this
  int64_t direct_mem_align_ = 0;  // and the bytes' address
};

// `size` bytes of address space, page aligned, backed by nothing yet (PROT_NONE) for File::map_into
// to fill; nullopt where the system refuses.
std::optional<MappedBytes> reserve_mapping(int64_t size);

// Whether every page of mapped file bytes is in the page cache (mincore). Where the kernel does
// not tell (a file the caller neither owns nor may write, Linux 5.2 on), it answers true; where
// mincore fails, false.
bool resident(std::span<const std::byte> mapped);

// Reads the pages of mapped file bytes in (MADV_POPULATE_READ), so that a file cut short or a disk
// error is an IoError naming `where` here and not a SIGBUS at first use.
void populate(std::span<const std::byte> mapped, const std::string& where);

// fsync of a directory, so a rename or a new entry in it survives a crash.
void sync_directory(const std::filesystem::path& dir);

// Writes `data` to a new file and, when `durable`, fsyncs it.
void write_file(const std::filesystem::path& path, std::string_view data, bool durable);

// The whole file, refused above `max_bytes` (metadata files are small; a huge one is corrupt).
std::string read_file(const std::filesystem::path& path, int64_t max_bytes);

// `root / name` for a name read from metadata, checked: a single path component that is not
// empty, ".", ".." and holds no '/' or NUL. `what` names the name's origin in the message.
std::filesystem::path child_path(const std::filesystem::path& root, std::string_view name,
                                 std::string_view what);

// `root / relative` for a '/'-separated path read from metadata (a chunk key, an OCDBT data file):
// each component checked as child_path does, and no directory on the way a symlink.
std::filesystem::path nested_path(const std::filesystem::path& root, std::string_view relative,
                                  std::string_view what);

// Throws IoError if `path` exists and is a symlink (a link could point out of the checkpoint).
void reject_symlink(const std::filesystem::path& path);

}  // namespace tessel::detail
