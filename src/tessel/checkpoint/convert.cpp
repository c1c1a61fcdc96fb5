// Conversions: the target ladder picks and places the leaves, restore reads a batch of them at a
// time straight into their blocks, a StateWriter writes them from there; through a key map, each
// target is made a piece at a time from boxes of its sources.
#include "tessel/checkpoint/convert.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <future>
#include <new>
#include <map>
#include <mutex>

#include "tessel/checkpoint/detail/io/parallel.h"
#include "tessel/checkpoint/detail/io/storage.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/store/zarr.h"
#include "tessel/checkpoint/manager.h"
#include "tessel/core/error.h"
#include "tessel/core/permute.h"
#include "tessel/runtime/cast.h"
#include "tessel/runtime/detail/kernels.h"

namespace tessel {
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The writer for `target` (abstract, keyed by the result's paths) in the format asked for.
std::unique_ptr<StateWriter> make_writer(CheckpointFormat format, const Location& dst, const State& target,
                                         const ConvertOptions& options, const std::optional<LogicalRules>& rules) {
  if (format == CheckpointFormat::kSafetensors) return std::make_unique<SafetensorsWriter>(dst, target, options.safetensors);
  SaveOptions save = options.orbax;
  save.rules = rules;
  if (!options.as_step) return std::make_unique<CheckpointWriter>(dst, target, save);
  // A CheckpointManager step, written inside `dst`'s temporary directory (StepRoot).
  save.checkpoint_metadata = false;
  const Location step_dir = dst / std::to_string(options.as_step->step);
  if (step_dir.is_local()) {
    std::error_code ec;
    fs::create_directories(step_dir.local(), ec);
    if (ec) throw IoError("cannot create '" + step_dir.string() + "': " + ec.message());
  }
  return std::make_unique<CheckpointWriter>(step_dir / options.as_step->item, target, save);
}

// A directory of steps appears whole. Local: written as `<dst>.orbax-checkpoint-tmp`, renamed at
// the end. In a bucket: written in place under an empty prefix, the step counted by its commit
// marker (write_step_metadata writes it last). Removed on failure.
class StepRoot {
 public:
  explicit StepRoot(const Location& dst) : dst_(dst), tmp_(dst) {
    if (dst.is_local()) {
      std::error_code ec;
      if (fs::exists(dst.local(), ec)) throw IoError("cannot save to '" + dst.string() + "': it already exists");
      tmp_ = Location(detail::begin_tmp_dir(dst.local()));
    } else {
      detail::refuse_bucket_root(dst);
      if (detail::exists(dst)) throw IoError("cannot save to '" + dst.string() + "': it already exists");
    }
  }
  ~StepRoot() {
    if (committed_) return;
    try {
      detail::remove_all(tmp_);
    } catch (const Error&) {
      // A bucket's leftovers hold no commit marker: no step; a later save clears them.
    }
  }
  const Location& tmp() const { return tmp_; }
  void commit(bool durable) {
    if (dst_.is_local()) detail::commit_tmp_dir(tmp_.local(), dst_.local(), durable, /*commit_file=*/false);
    committed_ = true;
  }

 private:
  Location dst_, tmp_;
  bool committed_ = false;
};

void add_extra(State& target, const std::vector<ExtraLeaf>& extra, const NamedSharding& replicated) {
  for (const ExtraLeaf& e : extra)
    target.insert(e.path, Variable::abstract(e.kind, e.value.shape(), e.value.dtype(), replicated));
}

// Writes the extra leaves, commits the item and then the step directory around it, if any.
void finish(StateWriter& writer, std::optional<StepRoot>& root, const ConvertOptions& options) {
  for (const ExtraLeaf& e : options.extra) {
    const HostBlock whole{Box::full(e.value.shape()), e.value.bytes()};
    writer.write(e.path, std::span<const HostBlock>(&whole, 1));
  }
  writer.commit();
  if (root) {
    write_step_metadata(root->tmp() / std::to_string(options.as_step->step), {options.as_step->item});
    root->commit(options.orbax.durable);
  }
}

// A worker's reusable buffer, page-aligned so that large blocks written from it can go to the disk
// directly (O_DIRECT wants aligned memory); it grows and is never cleared.
class PageBuffer {
 public:
  PageBuffer() = default;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer() { std::free(data_); }
  std::span<std::byte> get(size_t n) {
    if (n > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = (n + kPage - 1) / kPage * kPage;
      data_ = static_cast<std::byte*>(std::aligned_alloc(kPage, capacity_));
      if (!data_) throw std::bad_alloc();
    }
    return {data_, n};
  }

 private:
  static constexpr size_t kPage = 4096;
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

// `h` as `dtype`, rounded to nearest even.
HostArray cast_host(HostArray h, DType dtype) {
  if (h.dtype() == dtype) return h;
  HostArray out(h.shape(), dtype);
  detail::convert_run(h.dtype(), h.bytes().data(), dtype, out.mutable_bytes().data(), h.shape().num_elements());
  return out;
}

// A key map's conversion, streaming: each piece of a target (a stacked tensor's slab per source
// forward; the slab of a stacked source each target needs backward; else a whole tensor) is read
// from its source's box, made on the host and written as a block of its target, pieces in
// parallel within a budget of host bytes, so no stacked tensor is ever whole in memory.
ConvertReport convert_mapped(const CheckpointItem& src, const Location& dst, const ConvertOptions& options,
                             CheckpointFormat format) {
  const TargetSpec& spec = options.target;
  if (!spec.axis_map.empty() || !spec.paths.empty())
    throw ValueError("a key map picks its tensors by its rules and --select: leave out the paths and the axis map");
  const bool placed = spec.mesh || !spec.specs.empty() || !spec.logical_axes.empty() || !spec.shardings.empty();
  if (placed && format == CheckpointFormat::kSafetensors)
    throw ValueError("safetensors records no sharding: a mesh, shardings or logical axes place an Orbax target");
  const auto t0 = std::chrono::steady_clock::now();
  const State source = select_leaves(src.abstract_state(), spec.select);
  const MapPlan plan = plan_key_map(*options.map, source);
  const Mesh host({{"host", 1}});
  const NamedSharding on_host(host, PartitionSpec{});
  // More workers than cores: while one waits on the disk (a direct write), others read and permute.
  const int threads = detail::default_threads(0, 4);
  // Pieces small enough that every worker has one in flight within the budget (a permuted piece is
  // held twice: as read and permuted), so that reads, permutes and writes overlap.
  const int64_t max_piece = std::max<int64_t>(options.batch_bytes / (2 * threads), 1);
  struct Work {
    const MappedTensor* tensor;
    std::string path;  // the target's, renamed
    MapPiece piece;
    int64_t bytes;  // held while it is made: the source's part, the piece, a copy of either
  };
  std::vector<Work> work;
  // On a mesh, the item records each target's sharding there (its chunks are still the pieces:
  // a restore reads any device's box of them).
  // The given shardings are keyed by the result's paths (MaxText's dumps name params/params/...).
  State shardings;
  if (placed) {
    State abstract;
    for (const MappedTensor& t : plan.tensors)
      abstract.insert(rename_path(t.path, spec.rename), Variable::abstract(kParam, t.shape, t.dtype));
    shardings = place_abstract(abstract, spec);
  }
  State target;
  ConvertOptions writing = options;
  for (const MappedTensor& t : plan.tensors) {
    const std::string path = rename_path(t.path, spec.rename);
    // safetensors records no sharding, and takes a tensor in any boxes.
    const DType dtype = options.dtype.value_or(t.dtype);
    target.insert(path, format == CheckpointFormat::kSafetensors ? Variable::abstract(kParam, t.shape, dtype)
                        : placed ? Variable::abstract(kParam, t.shape, dtype, *shardings.at(path).sharding(),
                                                      shardings.at(path).partitioning())
                                 : Variable::abstract(kParam, t.shape, dtype, on_host));
    const Variable& s = source.at(t.sources.front());
    // Slabs read in one run each where the result takes any blocks (Orbax's chunks); safetensors
    // is written in runs of the target's rows.
    std::vector<MapPiece> pieces = map_pieces(t, s.shape(), max_piece, format == CheckpointFormat::kOrbax);
    // A tensor made in pieces is written a piece at a time: its blocks (and chunks) are theirs.
    if (pieces.size() > 1 || placed) writing.orbax.block_shapes[path] = pieces.front().target_box.shape();
    const bool permute_only = map_permutation(t, s.shape()) && dtype == s.dtype();
    for (MapPiece& p : pieces) {
      int64_t in = 0;
      for (const MapPiece::Read& r : p.reads) in += r.box.volume() * static_cast<int64_t>(item_size(s.dtype()));
      // Otherwise held as its source's part, a copy of it (transposed), the piece and a cast.
      const int64_t out = p.target_box.volume() * static_cast<int64_t>(item_size(dtype));
      work.push_back({&t, path, std::move(p), permute_only ? 2 * in : 2 * in + out});
    }
  }
  add_extra(target, options.extra, on_host);
  std::optional<StepRoot> root;
  if (options.as_step) root.emplace(dst);
  std::unique_ptr<StateWriter> writer =
      make_writer(format, root ? root->tmp() : dst, target, writing, placed ? spec.rules : std::nullopt);
  RestoreOptions reading;
  reading.staging_bytes = options.staging_bytes;
  reading.readers = 1;  // the pieces are the parallel work
  detail::ByteBudget budget(options.batch_bytes);
  std::mutex writing_mu;  // a writer takes one call at a time
  ConvertReport report;
  auto write = [&](const Work& w, std::span<const std::byte> bytes) {
    const HostBlock block{w.piece.target_box, bytes};
    std::lock_guard lock(writing_mu);
    writer->write(w.path, std::span<const HostBlock>(&block, 1));
    report.bytes += static_cast<int64_t>(bytes.size());
  };
  // Each worker's two buffers, reused from piece to piece: no fresh pages to fault in and clear.
  std::vector<std::array<PageBuffer, 2>> scratch(static_cast<size_t>(threads));
  detail::run_parallel(static_cast<int64_t>(work.size()), threads, [&](int64_t i, int worker) {
    const Work& w = work[static_cast<size_t>(i)];
    const MappedTensor& t = *w.tensor;
    detail::ByteLease lease(budget, w.bytes);
    const DType saved = source.at(t.sources.front()).dtype();
    const Shape& source_shape = source.at(t.sources.front()).shape();
    // Steps that only permute (most tensors): read into one buffer, permute into the other.
    if (const auto perm = map_permutation(t, source_shape); perm && options.dtype.value_or(saved) == saved) {
      const MapPiece::Read& r = w.piece.reads.front();
      const size_t bytes = static_cast<size_t>(r.box.volume()) * item_size(saved);
      const std::span<std::byte> in = scratch[static_cast<size_t>(worker)][0].get(bytes);
      read_box_into(src, t.sources[r.source], r.box, in, std::nullopt, reading);
      std::vector<int64_t> dims = r.box.shape().dims();
      if (!t.forward)
        for (auto it = t.unstack.rbegin(); it != t.unstack.rend(); ++it) dims.erase(dims.begin() + *it);
      if (std::is_sorted(perm->begin(), perm->end())) {
        write(w, in);
        return;
      }
      const std::span<std::byte> out = scratch[static_cast<size_t>(worker)][1].get(bytes);
      permute_copy(in.data(), Shape(std::move(dims)), item_size(saved), *perm, out.data());
      write(w, out);
      return;
    }
    // Into a wider dtype before the map's steps, so that a scale is exact there and undone
    // exactly on the way back; into a narrower one after, so that values round once.
    const bool widen = options.dtype && item_size(*options.dtype) >= item_size(saved);
    std::vector<HostArray> parts;
    for (const MapPiece::Read& r : w.piece.reads) {
      parts.push_back(read_box(src, t.sources[r.source], r.box, std::nullopt, reading));
      if (widen) parts.back() = cast_host(std::move(parts.back()), *options.dtype);
    }
    HostArray made = apply_piece(t, w.piece, std::move(parts));
    if (options.dtype && !widen) made = cast_host(std::move(made), *options.dtype);
    // Copied into the aligned buffer, so that it too may go to the disk directly.
    const std::span<std::byte> out = scratch[static_cast<size_t>(worker)][1].get(made.bytes().size());
    std::copy(made.bytes().begin(), made.bytes().end(), out.begin());
    write(w, out);
  });
  finish(*writer, root, options);
  report.written = format;
  report.source_tensors = static_cast<int64_t>(source.size());
  report.tensors = static_cast<int64_t>(plan.tensors.size());
  report.seconds = seconds_since(t0);
  report.map_forward = plan.forward;
  return report;
}

// The blocks a tensor too large for one batch goes in: its saved chunks (a safetensors tensor is
// one), grown along axis 0 or cut along the leading axes to at most `max_bytes`, so that each block
// is read as whole chunks or runs of one.
Shape slab_shape(const Shape& shape, const Shape& chunks, size_t item, int64_t max_bytes) {
  const size_t rank = shape.rank();
  std::vector<int64_t> b(rank);
  for (size_t d = 0; d < rank; ++d) b[d] = std::clamp<int64_t>(chunks[d], 1, std::max<int64_t>(shape[d], 1));
  std::vector<int64_t> suffix(rank + 1, static_cast<int64_t>(item));  // bytes of b[d:]
  for (size_t d = rank; d-- > 0;) suffix[d] = suffix[d + 1] * b[d];
  if (suffix[0] <= max_bytes) {
    b[0] = std::min(shape[0], b[0] * (max_bytes / suffix[0]));
    return Shape(std::move(b));
  }
  size_t a = 0;
  while (a + 1 < rank && suffix[a + 1] > max_bytes) b[a++] = 1;
  b[a] = std::clamp<int64_t>(max_bytes / suffix[a + 1], 1, b[a]);
  return Shape(std::move(b));
}

// For a safetensors target, whose tensors are row-major: blocks of whole rows (all of the trailing
// dimensions), each one contiguous run of the file, as many rows as fit in `max_bytes`. Stored
// uncompressed, each row's part of a chunk is a range of it (a MaxText kernel [embed, layers, mlp]
// chunked a layer at a time is read in ranges of whole rows); compressed, a chunk is decoded whole
// for every block it meets, so blocks are rows of whole chunks, or the chunks' own slabs where a
// row of chunks does not fit.
Shape row_slab_shape(const Shape& shape, const detail::ZarrArray& saved, size_t item, int64_t max_bytes) {
  std::vector<int64_t> rows(shape.dims().begin(), shape.dims().end());
  rows[0] = saved.raw_chunks() ? 1 : saved.chunks()[0];
  int64_t bytes = static_cast<int64_t>(item);
  for (int64_t n : rows) bytes = std::max<int64_t>(n, 1) > max_bytes / bytes ? max_bytes + 1 : bytes * std::max<int64_t>(n, 1);
  if (bytes > max_bytes) return slab_shape(shape, saved.chunks(), item, max_bytes);
  return slab_shape(shape, Shape(std::move(rows)), item, max_bytes);
}

// `v` (the saved `path`, as the target wants it) written as `to` in blocks of `block`, in row-major
// order, the next read while one is written.
void write_in_blocks(const CheckpointItem& src, const std::string& path, const Variable& v, const Shape& block,
                     const std::string& to, StateWriter& writer, const RestoreOptions& reading) {
  // The blocks are the chunks of a grid of `block` over the tensor (cut at its end), row-major.
  const detail::ZarrArray grid(v.shape(), block, v.dtype(), Compression::none());
  const Box full = Box::full(v.shape());
  std::vector<Box> boxes;
  for (const std::vector<int64_t>& index : grid.chunks_in(full)) boxes.push_back(full.intersect(grid.chunk_box(index)));
  if (boxes.empty()) boxes.push_back(full);  // a tensor of no elements: one empty block marks it written
  auto read = [&](size_t k) { return read_box(src, path, boxes[k], v.dtype(), reading); };
  std::future<HostArray> next = std::async(std::launch::async, read, size_t{0});
  for (size_t k = 0; k < boxes.size(); ++k) {
    const HostArray slab = next.get();
    if (k + 1 < boxes.size()) next = std::async(std::launch::async, read, k + 1);
    const HostBlock b{boxes[k], slab.bytes()};
    writer.write(to, std::span<const HostBlock>(&b, 1));
  }
}

// How `path` is stored: its chunks and codec.
detail::ZarrArray saved_zarr(const CheckpointItem& src, const std::string& path) {
  if (const ParamMetadata* p = src.metadata().find(path)) return src.zarr(*p);
  throw ValueError("'" + path + "' is not saved in " + src.dir().string());
}

}  // namespace

CheckpointFormat convert_format(const CheckpointItem& src, const ConvertOptions& options) {
  if (options.to) return *options.to;
  return src.format() == StorageFormat::kSafetensors ? CheckpointFormat::kOrbax : CheckpointFormat::kSafetensors;
}

ConvertReport convert(const Runtime& rt, const CheckpointItem& src, const Location& dst, const ConvertOptions& options) {
  const CheckpointFormat format = convert_format(src, options);
  if (format == CheckpointFormat::kSafetensors && (options.as_step || !options.extra.empty()))
    throw ValueError("a step layout and extra leaves are Orbax's: safetensors holds tensors only");
  if (options.map) return convert_mapped(src, dst, options, format);
  const auto t0 = std::chrono::steady_clock::now();
  TargetSpec spec = options.target;
  if (!spec.rules) spec.rules = src.metadata().rules;
  if (!spec.mesh) spec.mesh = one_device_mesh(spec.rules);
  State placed = make_target(src, spec, rt.device_count());
  if (options.dtype) {
    State cast;
    for (const auto& [path, v] : placed)
      cast.insert(path, Variable::abstract(v.kind(), v.shape(), *options.dtype, v.sharding(), v.partitioning()));
    placed = std::move(cast);
  }
  // On one device, a tensor larger than a batch goes a slab of rows at a time (read_box), so that
  // none is ever whole in memory (MaxText's stacked kernels are GiBs each); its Orbax chunks are
  // the slabs, and safetensors takes a tensor in any boxes.
  std::map<std::string, Shape> slabs;
  ConvertOptions writing = options;
  State written;
  for (const auto& [path, v] : placed) {
    if (spec.mesh->device_count() > 1 || v.nbytes() <= options.batch_bytes || v.shape().rank() == 0) {
      written.insert(path, v);
      continue;
    }
    // Half the budget each: one block is read while the one before is written.
    const int64_t half = std::max<int64_t>(options.batch_bytes / 2, 1);
    const detail::ZarrArray saved = saved_zarr(src, path);
    const Shape block = format == CheckpointFormat::kSafetensors
                            ? row_slab_shape(v.shape(), saved, item_size(v.dtype()), half)
                            : slab_shape(v.shape(), saved.chunks(), item_size(v.dtype()), half);
    slabs.emplace(path, block);
    writing.orbax.block_shapes[rename_path(path, spec.rename)] = block;
    written.insert(path, format == CheckpointFormat::kSafetensors ? Variable::abstract(v.kind(), v.shape(), v.dtype()) : v);
  }
  State target = rename_prefixes(written, spec.rename);  // checks the renames before anything is written
  add_extra(target, options.extra, NamedSharding(*spec.mesh, {}));
  std::optional<StepRoot> root;
  if (options.as_step) root.emplace(dst);
  std::unique_ptr<StateWriter> writer = make_writer(format, root ? root->tmp() : dst, target, writing, spec.rules);
  // A batch of tensors (at most batch_bytes, or one larger tensor) is restored, written from its
  // blocks and dropped before the next, so memory stays near the largest tensor.
  RestoreOptions restore_options;
  restore_options.partial = true;
  restore_options.staging_bytes = options.staging_bytes;
  ConvertReport report;
  int64_t batch_bytes = 0;
  State batch;
  auto flush = [&] {
    if (batch.empty()) return;
    for (const auto& [path, v] : restore(rt, src, batch, restore_options)) writer->write(rename_path(path, spec.rename), v.array());
    batch = State();
    batch_bytes = 0;
  };
  for (const auto& [path, v] : placed) {
    report.bytes += v.nbytes();
    if (auto block = slabs.find(path); block != slabs.end()) {
      flush();
      write_in_blocks(src, path, v, block->second, rename_path(path, spec.rename), *writer, restore_options);
      continue;
    }
    if (batch_bytes > 0 && batch_bytes + v.nbytes() > options.batch_bytes) flush();
    batch.insert(path, v);
    batch_bytes += v.nbytes();
  }
  flush();
  finish(*writer, root, options);
  report.written = format;
  report.source_tensors = static_cast<int64_t>(src.abstract_state().size());
  report.tensors = static_cast<int64_t>(placed.size());
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace tessel
