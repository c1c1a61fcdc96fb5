// The checkpoint layer's file access: direct writes (O_DIRECT) beside buffered ones.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/store/ocdbt.h"

namespace tessel {
namespace {
using detail::OcdbtDatabase;
using detail::OcdbtWriter;
namespace fs = std::filesystem;
using detail::File;

constexpr int64_t kMiB = int64_t{1} << 20;

struct AlignedBytes {
  explicit AlignedBytes(size_t n, std::mt19937& rng)
      : size(n), data(static_cast<std::byte*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)), &std::free) {
    for (size_t i = 0; i < n; ++i) data.get()[i] = static_cast<std::byte>(rng());
  }
  std::span<const std::byte> span(size_t from, size_t n) const { return {data.get() + from, n}; }
  size_t size;
  std::unique_ptr<std::byte, decltype(&std::free)> data;
};

// Which of the file's pages [offset, offset + size) are in the page cache (mincore of a mapping
// that is never touched, so it faults nothing in).
std::vector<bool> resident(const fs::path& path, int64_t offset, int64_t size) {
  const File f = File::open_read(path);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  std::optional<detail::MappedBytes> m = f.map(offset, size);
  if (!m) throw std::runtime_error("cannot map " + path.string());
  auto* begin = reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(m->data()) / page * page);
  const size_t length = static_cast<size_t>(m->data() + size - begin);
  std::vector<unsigned char> in((length + page - 1) / page);
  if (::mincore(begin, length, in.data()) != 0) throw std::runtime_error("mincore failed");
  std::vector<bool> out;
  for (unsigned char c : in) out.push_back((c & 1) != 0);
  return out;
}

std::string read_back(const fs::path& path) {
  const File f = File::open_read(path);
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_exact(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}

TEST(FileDirectWrites, LargeAlignedPartsGoAroundThePageCacheAndEveryByteLands) {
  testing::TempDir tmp;
  std::mt19937 rng(20261128);
  const fs::path path = tmp.path() / "f";
  File f = File::create(path);
  if (!f.enable_direct_writes()) GTEST_SKIP() << "the file system of " << tmp.path() << " reports no direct I/O";
  ASSERT_TRUE(f.direct_writes());
  const AlignedBytes src(8 * kMiB, rng);
  // Direct: 1 MiB from an aligned offset and address, its last 100 bytes buffered.
  f.write_at(0, src.span(0, kMiB + 100));
  // Buffered: an offset off the alignment, an address off it, less than 1 MiB.
  f.write_at(kMiB + 100, src.span(kMiB + 100, 2 * kMiB));
  f.write_at(4 * kMiB, src.span(64, 2 * kMiB));
  f.write_at(7 * kMiB, src.span(0, 4096));
  // Direct again, after a hole (which reads as zeros).
  f.write_at(12 * kMiB, src.span(0, 3 * kMiB));
  f.sync();

  std::string want(15 * kMiB, '\0');
  auto put = [&](int64_t at, std::span<const std::byte> bytes) {
    std::memcpy(want.data() + at, bytes.data(), bytes.size());
  };
  put(0, src.span(0, kMiB + 100));
  put(kMiB + 100, src.span(kMiB + 100, 2 * kMiB));
  put(4 * kMiB, src.span(64, 2 * kMiB));
  put(7 * kMiB, src.span(0, 4096));
  put(12 * kMiB, src.span(0, 3 * kMiB));
  EXPECT_EQ(f.size(), 15 * kMiB);

  // The direct parts left nothing in the page cache; the buffered ones are there.
  const std::vector<bool> first = resident(path, 0, kMiB + 100);
  EXPECT_EQ(std::count(first.begin(), first.end() - 1, true), 0) << "the direct part went through the page cache";
  EXPECT_TRUE(first.back()) << "the buffered tail is not in the page cache";
  const std::vector<bool> unaligned = resident(path, kMiB + 4096, kMiB);
  EXPECT_EQ(std::count(unaligned.begin(), unaligned.end(), true), static_cast<long>(unaligned.size()));
  const std::vector<bool> last = resident(path, 12 * kMiB, 3 * kMiB);
  EXPECT_EQ(std::count(last.begin(), last.end(), true), 0);

  f.close();
  EXPECT_FALSE(f.direct_writes());
  EXPECT_TRUE(read_back(path) == want) << "the file's bytes differ from what was written";
}

TEST(FileDirectWrites, MovedFilesKeepTheirDirectDescriptor) {
  testing::TempDir tmp;
  std::mt19937 rng(3);
  File a = File::create(tmp.path() / "f");
  if (!a.enable_direct_writes()) GTEST_SKIP() << "the file system of " << tmp.path() << " reports no direct I/O";
  File b = std::move(a);
  EXPECT_FALSE(a.direct_writes());
  EXPECT_TRUE(b.direct_writes());
  File c = File::create(tmp.path() / "g");
  c = std::move(b);
  const AlignedBytes src(2 * kMiB, rng);
  c.write_at(0, src.span(0, 2 * kMiB));
  c.sync();
  c.close();
  EXPECT_TRUE(read_back(tmp.path() / "f") == std::string(reinterpret_cast<const char*>(src.data.get()), 2 * kMiB));
  EXPECT_EQ(fs::file_size(tmp.path() / "g"), 0u);
}

// Drops a file's clean pages from the page cache (POSIX_FADV_DONTNEED after fsync).
void evict(const fs::path& path) {
  File f = File::open_write(path);
  f.sync();
  f.close();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) throw std::runtime_error("cannot evict");
  ::close(fd);
}

// A cold mapped restore reads a chunk's bytes into the page cache with read() first.
TEST(FileReadIntoCache, BringsTheRangeInAndStopsQuietlyAtTheEnd) {
  testing::TempDir tmp;
  std::mt19937 rng(20261129);
  const fs::path path = tmp.path() / "f";
  const AlignedBytes src(6 * kMiB, rng);
  {
    File f = File::create(path);
    f.write_all(src.span(0, src.size));
    f.sync();
    f.close();
  }
  evict(path);
  const File f = File::open_read(path);
  std::optional<detail::MappedBytes> chunk = f.map(kMiB + 64, 3 * kMiB);
  ASSERT_TRUE(chunk);
  const std::span<const std::byte> view(chunk->data(), static_cast<size_t>(chunk->size()));
  std::vector<bool> before = resident(path, kMiB + 64, 3 * kMiB);
  ASSERT_EQ(std::count(before.begin(), before.end(), true), 0) << "the page cache kept the file: cannot test";
  EXPECT_FALSE(detail::resident(view));

  f.read_into_cache(kMiB + 64, 3 * kMiB);
  const std::vector<bool> after = resident(path, kMiB + 64, 3 * kMiB);
  EXPECT_EQ(std::count(after.begin(), after.end(), true), static_cast<long>(after.size()));
  EXPECT_TRUE(detail::resident(view));
  detail::populate(view, "the test file");
  EXPECT_EQ(std::memcmp(view.data(), src.span(kMiB + 64, 3 * kMiB).data(), view.size()), 0);

  // Past the file's end: what is there comes in, the rest is left to populate() to report.
  evict(path);
  f.read_into_cache(5 * kMiB, 4 * kMiB);
  const std::vector<bool> tail = resident(path, 5 * kMiB, kMiB);
  EXPECT_EQ(std::count(tail.begin(), tail.end(), true), static_cast<long>(tail.size()));
}

// A durable OCDBT save writes its large values directly: from 4 threads, of sizes on and off the
// page size, some from addresses off the alignment, small ones in between.
TEST(FileDirectWrites, DurableOcdbtDatabasesReadBack) {
  testing::TempDir tmp;
  std::mt19937 rng(11);
  const AlignedBytes src(4 * kMiB, rng);
  std::vector<std::pair<std::string, std::span<const std::byte>>> values;
  for (int i = 0; i < 40; ++i) {
    const int kind = i % 4;
    const size_t size = kind == 0   ? 3000 + rng() % 5000
                        : kind == 1 ? kMiB + rng() % kMiB
                        : kind == 2 ? (1 + rng() % 3) * kMiB
                                    : kMiB + 4096 * (rng() % 8);
    const size_t from = i % 5 == 0 ? 64 * (1 + rng() % 4) : 0;
    values.emplace_back("v/" + std::to_string(i), src.span(from, std::min(size, src.size - from)));
  }
  OcdbtWriter w(tmp.path() / "db", {.target_data_file_bytes = 6 * kMiB, .durable = true});
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < values.size(); i += 4) w.put(values[i].first, values[i].second);
    });
  }
  for (auto& t : pool) t.join();
  w.commit();
  const auto db = OcdbtDatabase::open(tmp.path() / "db");
  ASSERT_EQ(db.entries().size(), values.size());
  std::map<std::string, std::span<const std::byte>> by_key(values.begin(), values.end());
  for (const auto& e : db.entries()) {
    const auto want = by_key.at(e.key);
    EXPECT_TRUE(db.read_all(e) == std::string(reinterpret_cast<const char*>(want.data()), want.size())) << e.key;
  }
}

}  // namespace
}  // namespace tessel
