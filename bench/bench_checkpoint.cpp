// Checkpoint figures, one measurement per process so each peak RSS is its own (driven by
// bench/checkpoint_bench.sh, which prints the ratios):
//   bench_checkpoint raw DIR BYTES          raw write+fsync and cached read of 8 files (1 and 2 threads),
//                                          direct write+fsync (1, 2 and 4 threads)
//   bench_checkpoint save DIR BYTES CODEC [LAYOUT]
//                                          a BYTES f32 state on fsdp=8, saved with CODEC (none, zstd:1)
//                                          as LAYOUT: ocdbt (default), files, ocdbt+zarr3, files+zarr3
//   bench_checkpoint restore DIR MESH       restore onto MESH (logical axes through the rules)
// Each prints one JSON object.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/state/init.h"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int64_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

const tessel::LogicalRules& rules() {
  static const tessel::LogicalRules r({{"embed", {"fsdp"}}, {"mlp", {"tensor"}}}, {"data", "fsdp", "tensor"});
  return r;
}

constexpr int64_t kRows = 8192, kCols = 4096;  // 128 MiB per parameter

// Values like trained weights: random mantissas (they barely compress), a narrow exponent range.
void fill(const tessel::Box& box, std::span<std::byte> out) {
  auto* f = reinterpret_cast<float*>(out.data());
  const int64_t n = box.volume();
  uint64_t x = static_cast<uint64_t>(box.start(0)) * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const uint32_t bits = 0x3c000000u | static_cast<uint32_t>(x & 0x01ffffffu) | (static_cast<uint32_t>(x >> 63) << 31);
    std::memcpy(f + i, &bits, 4);
  }
}

// With TESSEL_BENCH_PRIME_BYTES set, touches and frees that many bytes first (as
// bench/ckpt_peers.py does): on a VM whose balloon hands idle free memory back to the host, the
// measured work then runs on host-backed memory, like the peers it is compared with.
void prime_memory() {
  const char* text = std::getenv("TESSEL_BENCH_PRIME_BYTES");
  const int64_t n = text ? std::atoll(text) : 0;
  if (n <= 0) return;
  std::unique_ptr<std::byte[]> block(new std::byte[static_cast<size_t>(n)]);
  std::memset(block.get(), 1, static_cast<size_t>(n));
  asm volatile("" : : "r"(block.get()) : "memory");  // the stores must happen
}

// `files` files of `data` written into a fresh `dir` from `threads` threads, each fsynced, then the
// directory: GB/s. With `direct`, through File::enable_direct_writes; 0 where a file refuses it.
double write_fsync(const fs::path& dir, int files, int threads, std::span<const std::byte> data, bool direct) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  prime_memory();  // the page cache the writes fill comes from memory the host backs
  std::atomic<bool> refused{false};
  auto t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int i = t; i < files; i += threads) {
        auto f = tessel::detail::File::create(dir / std::to_string(i));
        if (direct && !f.enable_direct_writes()) refused = true;
        f.write_at(0, data);
        f.sync();
        f.close();
      }
    });
  }
  for (auto& p : pool) p.join();
  tessel::detail::sync_directory(dir);
  return refused ? 0.0 : static_cast<double>(data.size()) * files / since(t0) / 1e9;
}

nlohmann::json raw(const fs::path& dir, int64_t bytes) {
  const int files = 8;
  const int64_t each = bytes / files;
  std::vector<std::byte> buf(static_cast<size_t>(each));
  fill(tessel::Box({0}, {each / 4}), buf);
  nlohmann::json j;
  for (int threads : {1, 2}) {
    j["write_fsync_gbps_" + std::to_string(threads)] = write_fsync(dir, files, threads, buf, false);
    // Cached read: the files were just written.
    auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<std::byte> in(static_cast<size_t>(each));
        for (int i = t; i < files; i += threads) tessel::detail::File::open_read(dir / std::to_string(i)).read_exact(0, in);
      });
    }
    for (auto& p : pool) p.join();
    j["read_cached_gbps_" + std::to_string(threads)] = static_cast<double>(bytes) / since(t0) / 1e9;
    // The same into fresh memory, as a restore must: the first touch of new pages is part of it.
    std::vector<std::unique_ptr<std::byte[]>> fresh(files);
    t0 = Clock::now();
    pool.clear();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int i = t; i < files; i += threads) {
          fresh[i].reset(new std::byte[static_cast<size_t>(each)]);
          tessel::detail::File::open_read(dir / std::to_string(i)).read_exact(0, {fresh[i].get(), static_cast<size_t>(each)});
        }
      });
    }
    for (auto& p : pool) p.join();
    j["read_fresh_gbps_" + std::to_string(threads)] = static_cast<double>(bytes) / since(t0) / 1e9;
    // Filling fresh memory: what every target byte a restore does not read costs at least (the
    // replicas of a block), and what this machine's first touch of a page costs.
    std::vector<std::unique_ptr<std::byte[]>> filled(files);
    t0 = Clock::now();
    pool.clear();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (int i = t; i < files; i += threads) {
          filled[i].reset(new std::byte[static_cast<size_t>(each)]);
          std::memset(filled[i].get(), 1, static_cast<size_t>(each));
        }
      });
    }
    for (auto& p : pool) p.join();
    j["fill_fresh_gbps_" + std::to_string(threads)] = static_cast<double>(bytes) / since(t0) / 1e9;
  }
  // Direct writes (O_DIRECT, page-aligned memory) + fsync from 1, 2 and 4 threads: the disk
  // without the page cache's copies, as a durable save writes where the file system allows it.
  std::unique_ptr<std::byte, decltype(&std::free)> aligned(
      static_cast<std::byte*>(std::aligned_alloc(4096, static_cast<size_t>((each + 4095) / 4096 * 4096))), &std::free);
  std::memcpy(aligned.get(), buf.data(), buf.size());
  for (int threads : {1, 2, 4}) {
    const double gbps = write_fsync(dir, files, threads, {aligned.get(), static_cast<size_t>(each)}, true);
    if (gbps == 0) break;  // this file system has no direct I/O: no figure
    j["write_direct_fsync_gbps_" + std::to_string(threads)] = gbps;
  }
  fs::remove_all(dir);
  return j;
}

tessel::State make_state(const tessel::Runtime& rt, int64_t bytes) {
  const tessel::Mesh mesh = tessel::Mesh::parse("fsdp=8", rules().mesh_axes());
  tessel::State s;
  const int64_t params = std::max<int64_t>(1, bytes / (kRows * kCols * 4));
  for (int64_t i = 0; i < params; ++i) {
    const auto part = tessel::Partitioning::by_logical({"embed", "mlp"});
    const tessel::Shape shape{kRows, kCols};
    auto sharding = tessel::resolve_sharding(part, shape, mesh, rules());
    auto a = tessel::make_array_from_callback(rt, shape, tessel::DType::kF32, sharding, fill);
    s.insert("layers/" + std::to_string(i) + "/kernel", tessel::Variable(tessel::kParam, a, part));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    nlohmann::json j;
    if (mode == "raw" && argc == 4) {
      j = raw(argv[2], std::stoll(argv[3]));
    } else if (mode == "save" && argc >= 5 && argc <= 7) {
      const std::string layout = argc >= 6 ? argv[5] : "ocdbt";
      const int64_t max_chunk_bytes = argc == 7 ? std::stoll(argv[6]) << 20 : int64_t{64} << 20;
      tessel::Runtime rt = tessel::Runtime::host(8);
      tessel::State s = make_state(rt, std::stoll(argv[3]));
      fs::remove_all(argv[2]);
      prime_memory();  // as raw does before its writes
      const int64_t before = peak_rss();
      auto t0 = Clock::now();
      tessel::save(argv[2], s,
                   {.compression = tessel::Compression::parse(argv[4]),
                    .use_ocdbt = layout.starts_with("ocdbt"),
                    .use_zarr3 = layout.ends_with("zarr3"),
                    .max_chunk_bytes = max_chunk_bytes,
                    .rules = rules()});
      const double sec = since(t0);
      j = {{"bytes", s.nbytes()}, {"seconds", sec}, {"gbps", static_cast<double>(s.nbytes()) / sec / 1e9},
           {"rss_before", before}, {"peak_rss", peak_rss()}};
    } else if (mode == "restore" && argc >= 4 && argc <= 6) {
      const int readers = argc >= 5 ? std::stoi(argv[4]) : 0;
      const bool map_chunks = argc != 6 || std::string(argv[5]) != "copy";
      const tessel::Mesh mesh = tessel::Mesh::parse(argv[3], rules().mesh_axes());
      tessel::Runtime rt = tessel::Runtime::host(mesh.device_count());
      tessel::State target;
      for (const auto& [path, v] : tessel::CheckpointItem::open(argv[2]).abstract_state()) {
        target.insert(path, tessel::Variable::abstract(v.kind(), v.shape(), v.dtype(),
                                                       tessel::resolve_sharding(v.partitioning(), v.shape(), mesh, rules()),
                                                       v.partitioning()));
      }
      tessel::RestoreStats stats;
      prime_memory();
      auto t0 = Clock::now();
      tessel::State s = tessel::restore(rt, argv[2], target, {.readers = readers, .map_chunks = map_chunks}, &stats);
      const double sec = since(t0);
      const int64_t bytes = s.nbytes();
      j = {{"bytes", bytes}, {"seconds", sec}, {"gbps", static_cast<double>(bytes) / sec / 1e9},
           {"target_bytes", stats.target_bytes}, {"bytes_read", stats.bytes_read}, {"bytes_mapped", stats.bytes_mapped},
           {"staging_peak", stats.staging_peak}, {"peak_rss", peak_rss()}};
      // Again, as in a running job that restores again: chunks that are not mapped land in the
      // device memory the first restore freed (the devices cache freed blocks), no new pages.
      s = tessel::State();
      t0 = Clock::now();
      s = tessel::restore(rt, argv[2], target, {.readers = readers, .map_chunks = map_chunks});
      j["warm_seconds"] = since(t0);
      j["warm_gbps"] = static_cast<double>(bytes) / j["warm_seconds"].get<double>() / 1e9;
    } else {
      std::cerr << "usage: bench_checkpoint raw DIR BYTES | save DIR BYTES CODEC [LAYOUT [MAX_CHUNK_MIB]] | "
                   "restore DIR MESH [READERS [map|copy]]\n";
      return 2;
    }
    std::cout << j.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_checkpoint: " << e.what() << "\n";
    return 1;
  }
}
