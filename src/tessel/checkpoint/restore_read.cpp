// A restore's reading stage: one task per chunk that some local block needs, each reading the
// chunk once (uncompressed chunks by byte ranges straight into the blocks, or in slabs; compressed
// ones decoded once for every block that needs them), with host staging bounded.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "tessel/checkpoint/codec.h"
#include "tessel/checkpoint/detail/io/crc32c.h"
#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/restore_plan.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/runtime/detail/kernels.h"

namespace tessel::detail {
namespace {

// A worker's reusable host buffer. A restore reads hundreds of chunks; a fresh buffer for each
// would fault in (and have the kernel clear) every page of it again.
class Scratch {
 public:
  // A buffer of n bytes, reused while n is within `keep` bytes; larger ones are temporary.
  std::span<std::byte> get(size_t n, size_t keep, std::unique_ptr<std::byte[]>& temporary) {
    if (n > keep) {
      temporary.reset(new std::byte[n]);
      return {temporary.get(), n};
    }
    if (n > size_) {
      data_.reset();
      data_.reset(new std::byte[n]);
      size_ = n;
    }
    return {data_.get(), n};
  }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

// Per worker: one buffer for stored bytes and one for decoded ones, `keep` bytes each at most.
struct WorkerBuffers {
  Scratch stored, decoded;
  size_t keep = 0;
};



struct ReadTask {
  size_t param;
  std::vector<int64_t> index;
  std::vector<size_t> dests;
};

// Copies (casting when the dtypes differ) the part of `chunk` each destination needs.
void scatter(const LeafRead& p, const Box& chunk, const std::byte* src, const ReadTask& task) {
  const DType from = p.zarr.dtype(), to = p.target_dtype;
  const size_t in = item_size(from), out = item_size(to);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    const Box region = chunk.intersect(dst.box);
    for_each_run(region, chunk, dst.box, [&](int64_t s, int64_t t, int64_t n) {
      if (from == to) {
        std::memcpy(dst.data + t * out, src + s * in, static_cast<size_t>(n) * in);
      } else {
        convert_run(from, src + s * in, to, dst.data + t * out, n);
      }
    });
  }
}

void fill_missing(const LeafRead& p, const Box& chunk, const ReadTask& task) {
  const size_t item = item_size(p.target_dtype);
  std::vector<std::byte> value(item);
  const double fill = p.zarr.fill_value().value_or(0.0);
  convert_run(DType::kF64, reinterpret_cast<const std::byte*>(&fill), p.target_dtype, value.data(), 1);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    for_each_run(chunk.intersect(dst.box), chunk, dst.box, [&](int64_t, int64_t t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst.data + (t + i) * static_cast<int64_t>(item), value.data(), item);
    });
  }
}

// An uncompressed chunk of the target dtype: each destination's runs are read straight into its
// buffer, consecutive runs in one read of at most the source's read unit (1 MiB from a file, so
// that the checksum that follows each read finds the bytes in cache; 16 MiB from an object).
void read_ranges(const LeafRead& p, const StoredValue& f, const Box& chunk, const ReadTask& task,
                 const std::string& key, bool verify, ReadCounters& counters) {
  const int64_t item = static_cast<int64_t>(item_size(p.zarr.dtype()));
  const int64_t piece = std::max<int64_t>(1, f.read_unit() / item);
  for (size_t d : task.dests) {
    const Destination& dst = p.dests[d];
    const Box region = chunk.intersect(dst.box);
    // The whole chunk lands in this buffer, in file order: check it against the saved checksum.
    const bool check = verify && region == chunk && p.has_crc(key);
    uint32_t crc = 0;
    std::vector<iovec> iov;
    int64_t run_start = -1, run_end = -1;
    auto flush = [&] {
      if (iov.empty()) return;
      f.read_scatter(run_start * item, iov);
      counters.bytes += (run_end - run_start) * item;
      for (const iovec& v : iov) {
        auto* at = static_cast<std::byte*>(v.iov_base);
        if (check) crc = crc32c({at, v.iov_len}, crc);
      }
      iov.clear();
    };
    for_each_run(region, chunk, dst.box, [&](int64_t s, int64_t t, int64_t n) {
      for (int64_t done = 0; done < n;) {
        const int64_t len = std::min(n - done, piece);
        if (s + done != run_end || iov.size() >= 1024 || run_end - run_start + len > piece) {
          flush();
          run_start = s + done;
        }
        iov.push_back({dst.data + (t + done) * item, static_cast<size_t>(len * item)});
        run_end = s + done + len;
        done += len;
      }
    });
    flush();
    if (check) check_crc(p, key, crc);
  }
}

// True when this process's destinations need all of the chunk in short pieces (column blocks out
// of row-major chunks): then reading the chunk once, slab by slab, beats one read per piece. A
// process that needs only part of it reads just its pieces, so no process reads others' bytes.
bool small_runs(const LeafRead& p, const Box& chunk, const ReadTask& task) {
  int64_t runs = 0, elements = 0;
  for (size_t d : task.dests) {
    const Box region = chunk.intersect(p.dests[d].box);
    elements += region.volume();
    for_each_run(region, chunk, p.dests[d].box, [&](int64_t, int64_t, int64_t) { ++runs; });
  }
  const int64_t bytes = elements * static_cast<int64_t>(item_size(p.zarr.dtype()));
  return runs > 64 && bytes / runs < (int64_t{64} << 10) && bytes >= p.zarr.chunk_bytes();
}

// An uncompressed chunk read whole, in slabs along its first dimension of about the source's read
// unit, each scattered (and cast, if the dtypes differ) into the destinations.
void read_slabs(const LeafRead& p, const StoredValue& f, const Box& chunk, const ReadTask& task,
                const std::string& key, ByteBudget& staging, WorkerBuffers& buffers, bool verify,
                ReadCounters& counters) {
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  const size_t rank = chunk.rank();
  const int64_t rows = rank == 0 ? 1 : chunk.extent(0);
  const int64_t row_bytes = rows == 0 ? 0 : chunk_bytes / rows;
  const int64_t slab_rows =
      std::clamp<int64_t>(row_bytes == 0 ? rows : f.read_unit() / row_bytes, 1, std::max<int64_t>(rows, 1));
  const int64_t slab_bytes = slab_rows * row_bytes;
  const bool reused = static_cast<size_t>(slab_bytes) <= buffers.keep;
  ByteLease lease(staging, reused ? 0 : slab_bytes);
  std::unique_ptr<std::byte[]> temporary;
  const std::span<std::byte> buf = buffers.stored.get(static_cast<size_t>(slab_bytes), buffers.keep, temporary);
  uint32_t crc = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
    const int64_t r1 = std::min(rows, r0 + slab_rows);
    std::span<std::byte> slab(buf.data(), static_cast<size_t>((r1 - r0) * row_bytes));
    f.read(r0 * row_bytes, slab);
    counters.bytes += static_cast<int64_t>(slab.size());
    if (verify) crc = crc32c(slab, crc);
    Box slab_box = chunk;
    if (rank > 0) {
      std::vector<int64_t> start(chunk.starts().begin(), chunk.starts().end());
      std::vector<int64_t> stop(chunk.stops().begin(), chunk.stops().end());
      start[0] = chunk.start(0) + r0;
      stop[0] = chunk.start(0) + r1;
      slab_box = Box(std::move(start), std::move(stop));
    }
    scatter(p, slab_box, slab.data(), task);
  }
  if (verify) check_crc(p, key, crc);
}



// Large chunks only: a cold restore of one pread per worker leaves the disk's queue nearly empty
// (2 readers: ~2 GB/s where 8 concurrent readers get ~2.7), so each worker hints the chunk that
// is picked after the running ones. Small chunks are left to the kernel's readahead, and chunks
// inside zarr3 shards too (finding one reads its shard's index, which the task would read again).
// Errors are the read's to report.
void will_need(const LeafRead& p, std::span<const int64_t> index) noexcept {
  if (p.zarr.chunk_bytes() < (int64_t{1} << 20) || p.zarr.sharded()) return;
  try {
    if (auto value = locate_chunk(p, index, p.zarr.chunk_key(index))) value->will_need();
  } catch (...) {
  }
}

void run_task(const LeafRead& p, const ReadTask& task, ByteBudget& staging, WorkerBuffers& buffers, bool verify,
              ReadCounters& counters) {
  const Box chunk = p.zarr.chunk_box(task.index);
  const std::string key = p.zarr.chunk_key(task.index);
  const std::optional<StoredValue> value = locate_chunk(p, task.index, key);
  if (!value) {
    if (!p.allow_missing) throw ValueError(chunk_what(p, key) + " is missing");
    fill_missing(p, chunk, task);
    return;
  }
  const StoredValue& f = *value;
  const int64_t size = f.size();
  const int64_t chunk_bytes = p.zarr.chunk_bytes();
  // A chunk that carries its own CRC-32C is read whole, like a compressed one.
  const bool raw = p.zarr.raw_chunks();
  if (raw && size != chunk_bytes) {
    throw ValueError(chunk_what(p, key) + ": " + std::to_string(size) + " bytes, an uncompressed chunk of " +
                     p.zarr.chunks().to_string() + " " + std::string(name(p.zarr.dtype())) + " has " +
                     std::to_string(chunk_bytes));
  }
  counters.chunks += 1;
  if (raw && p.zarr.dtype() == p.target_dtype && !small_runs(p, chunk, task)) {
    read_ranges(p, f, chunk, task, key, verify, counters);
    return;
  }
  if (raw) {
    read_slabs(p, f, chunk, task, key, staging, buffers, verify, counters);
    return;
  }
  // A compressed chunk: decoded once, whole, for every destination.
  if (size > max_stored_bytes(chunk_bytes)) {
    throw ValueError(chunk_what(p, key) + ": " + std::to_string(size) + " stored bytes for a chunk of " +
                     std::to_string(chunk_bytes) + ": not a compressed chunk of this array");
  }
  // A chunk that is exactly one destination's block (the same mesh) decodes straight into it.
  const Destination* whole = task.dests.size() == 1 ? &p.dests[task.dests.front()] : nullptr;
  if (whole && (whole->box != chunk || p.zarr.dtype() != p.target_dtype ||
                chunk.volume() * static_cast<int64_t>(item_size(p.target_dtype)) != chunk_bytes)) {
    whole = nullptr;
  }
  const int64_t staged = size + (whole ? 0 : chunk_bytes);
  const bool reused = static_cast<size_t>(size) <= buffers.keep && static_cast<size_t>(chunk_bytes) <= buffers.keep;
  ByteLease lease(staging, reused ? 0 : staged);
  std::unique_ptr<std::byte[]> temporary_stored, temporary_decoded;
  const size_t keep = reused ? buffers.keep : 0;
  const std::span<std::byte> stored = buffers.stored.get(static_cast<size_t>(size), keep, temporary_stored);
  f.read(0, stored);
  counters.bytes += size;
  if (verify) check_crc(p, key, crc32c(stored));
  const std::span<const std::byte> encoded = strip_chunk_crc(p, key, stored);
  if (whole) {
    const std::span<std::byte> out(whole->data, static_cast<size_t>(chunk_bytes));
    decompress(p.zarr.compression(), encoded, out, chunk_what(p, key));
    return;
  }
  const std::span<std::byte> decoded = buffers.decoded.get(static_cast<size_t>(chunk_bytes), keep, temporary_decoded);
  decompress(p.zarr.compression(), encoded, decoded, chunk_what(p, key));
  scatter(p, chunk, decoded.data(), task);
}


}  // namespace

int64_t read_chunks(std::vector<LeafRead>& leaves, int readers, int64_t staging_bytes, bool verify,
                    ReadCounters& counters) {
  // One destination per distinct local block not mapped, and one task per chunk that some
  // destination needs, listing every such destination.
  std::vector<ReadTask> tasks;
  for (size_t pi = 0; pi < leaves.size(); ++pi) {
    LeafRead& p = leaves[pi];
    for (size_t i = 0; p.builder && i < p.builder->size(); ++i) {
      const Shard& s = p.builder->shard(i);
      if (!p.builder->fills(i) || s.box.empty()) continue;
      p.dests.push_back({p.builder->data(i), s.box});
    }
    std::map<std::vector<int64_t>, size_t> by_chunk;
    for (size_t d = 0; d < p.dests.size(); ++d) {
      for (auto& index : p.zarr.chunks_in(p.dests[d].box)) {
        auto [it, fresh] = by_chunk.emplace(index, tasks.size());
        if (fresh) tasks.push_back({pi, index, {}});
        tasks[it->second].dests.push_back(d);
      }
    }
  }
  // Half of the staging budget for the workers' reusable buffers (two each), half for leases.
  // Reads from a bucket wait on the network, not the cores: 16 requests in flight at least.
  const bool remote = std::any_of(leaves.begin(), leaves.end(), [](const LeafRead& p) { return p.store->is_remote(); });
  const int threads = static_cast<int>(
      std::min<int64_t>(default_threads(readers, remote ? 16 : 2), std::max<size_t>(tasks.size(), 1)));
  const int64_t budget = std::max<int64_t>(staging_bytes, 2);
  ByteBudget staging(budget / 2);
  std::vector<WorkerBuffers> buffers(static_cast<size_t>(threads));
  for (auto& b : buffers) b.keep = static_cast<size_t>(budget / 4 / threads);
  run_parallel(static_cast<int64_t>(tasks.size()), threads, [&](int64_t t, int worker) {
    if (t + threads < static_cast<int64_t>(tasks.size())) {
      const ReadTask& next = tasks[static_cast<size_t>(t + threads)];
      will_need(leaves[next.param], next.index);
    }
    const ReadTask& task = tasks[static_cast<size_t>(t)];
    const LeafRead& p = leaves[task.param];
    try {
      run_task(p, task, staging, buffers[static_cast<size_t>(worker)], verify, counters);
    } catch (const IoError& e) {
      // A file the store names is gone or unreadable (another process's database deleted, say):
      // say which array's chunk needed it.
      throw IoError(chunk_what(p, p.zarr.chunk_key(task.index)) + ": " + e.what());
    }
  });
  int64_t kept = 0;
  for (const auto& b : buffers) kept += static_cast<int64_t>(b.stored.size() + b.decoded.size());
  return staging.peak() + kept;
}

}  // namespace tessel::detail
