// Writing safetensors (SafetensorsWriter): the leader lays out every file (tensors ordered by
// item size, largest first, then by name, as the format's own writer does, so each tensor is
// aligned to its item size) and writes the headers; every process then writes its blocks at their
// offsets, and the leader commits the directory by renaming it.
#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/detail/io/output.h"
#include "tessel/checkpoint/detail/orbax_layout.h"
#include "tessel/checkpoint/detail/store/safetensors_file.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/detail/json_util.h"
#include "tessel/runtime/process_group.h"

namespace tessel {
namespace fs = std::filesystem;
using json_util::Json;

namespace {

constexpr const char* kSafetensorsTmpSuffix = ".tmp";
// A block whose runs in the tensor are shorter than this is gathered into a slab before writing.
constexpr int64_t kSlabBytes = int64_t{16} << 20;

struct Placed {
  std::string path;
  Shape shape;
  DType dtype;
  std::string name;
  size_t file = 0;
  int64_t begin = 0;  // within the file's data section
  int64_t bytes = 0;
};

struct Layout {
  std::vector<std::string> files;
  std::vector<std::string> headers;  // per file, padded with spaces so the data starts 64-byte aligned
  std::vector<int64_t> data_bytes;
  std::vector<Placed> tensors;
};

std::string tensor_name(const std::string& path) {
  std::string name = path;
  for (size_t start = 0; start <= path.size();) {
    const size_t slash = std::min(path.find('/', start), path.size());
    if (path.substr(start, slash - start).find('.') != std::string::npos)
      throw ValueError(fmt::format("cannot save '{}' as safetensors: the level '{}' holds a '.', which names a level "
                                   "in safetensors (it would read back as another tree)",
                                   path, path.substr(start, slash - start)));
    start = slash + 1;
  }
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

Layout plan_files(const std::vector<std::tuple<std::string, Shape, DType>>& arrays, const SafetensorsSaveOptions& options) {
  if (options.max_file_bytes < 0) throw ValueError("max_file_bytes must not be negative");
  Layout l;
  for (const auto& [path, shape, dtype] : arrays) {
    detail::safetensors_dtype(dtype);  // every tessel dtype has one; checked before anything is written
    l.tensors.push_back({path, shape, dtype, tensor_name(path), 0, 0, shape.num_elements() * static_cast<int64_t>(item_size(dtype))});
  }
  std::sort(l.tensors.begin(), l.tensors.end(), [](const Placed& a, const Placed& b) {
    const size_t ia = item_size(a.dtype), ib = item_size(b.dtype);
    return ia != ib ? ia > ib : a.name < b.name;
  });
  // Files in that order, each up to the limit; a larger tensor gets a file of its own.
  std::vector<int64_t> sizes{0};
  for (Placed& t : l.tensors) {
    if (options.max_file_bytes > 0 && sizes.back() > 0 && sizes.back() + t.bytes > options.max_file_bytes)
      sizes.push_back(0);
    t.file = sizes.size() - 1;
    t.begin = sizes.back();
    sizes.back() += t.bytes;
  }
  const size_t n = sizes.size();
  for (size_t f = 0; f < n; ++f)
    l.files.push_back(n == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, n));
  std::vector<Json> headers(n, Json::object());
  if (!options.metadata.empty())
    for (Json& h : headers) h["__metadata__"] = options.metadata;
  for (const Placed& t : l.tensors)
    headers[t.file][t.name] = {{"dtype", std::string(detail::safetensors_dtype(t.dtype))},
                               {"shape", t.shape.dims()},
                               {"data_offsets", {t.begin, t.begin + t.bytes}}};
  for (size_t f = 0; f < n; ++f) {
    std::string text = json_util::dump(headers[f]);
    // The format asks for 8; 64 (a device buffer's alignment) lets a restore map the first
    // tensor's bytes, and each later one whose offset is a multiple of 64 (RestoreOptions::map_chunks).
    text.append((64 - (8 + text.size()) % 64) % 64, ' ');
    l.headers.push_back(std::move(text));
  }
  l.data_bytes = std::move(sizes);
  return l;
}

void write_header(const fs::path& path, const std::string& header, int64_t data_bytes) {
  detail::File f = detail::File::create(path);
  std::string prefix(8, '\0');
  uint64_t n = header.size();
  for (size_t i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  f.write_all({reinterpret_cast<const std::byte*>(prefix.data()), prefix.size()});
  f.write_all({reinterpret_cast<const std::byte*>(header.data()), header.size()});
  f.resize(8 + static_cast<int64_t>(header.size()) + data_bytes);
  f.close();
}

// This process's blocks of one tensor, at their places in C order. Rows of the tensor are
// gathered into slabs when this process holds every block and the blocks' runs are short (a
// column-sharded tensor); otherwise each run is written where it goes.
void write_tensor(detail::OutputFile& file, int64_t at, const Placed& t, std::span<const HostBlock> blocks,
                  std::vector<std::byte>& slab) {
  const int64_t item = static_cast<int64_t>(item_size(t.dtype));
  const Box full = Box::full(t.shape);
  int64_t covered = 0, runs = 0;
  for (const auto& b : blocks) {
    covered += b.box.volume();
    for_each_run(b.box, b.box, full, [&](int64_t, int64_t, int64_t) { ++runs; });
  }
  const bool gather = t.shape.rank() > 0 && covered == full.volume() && runs > 0 &&
                      covered * item / runs < (int64_t{64} << 10);
  if (!gather) {
    for (const auto& b : blocks)
      for_each_run(b.box, b.box, full, [&](int64_t s, int64_t d, int64_t n) {
        file.write_at(at + d * item, b.bytes.subspan(static_cast<size_t>(s * item), static_cast<size_t>(n * item)));
      });
    return;
  }
  const int64_t rows = t.shape[0];
  const int64_t row_bytes = rows == 0 ? 0 : t.bytes / rows;
  const int64_t slab_rows = std::clamp<int64_t>(row_bytes == 0 ? rows : kSlabBytes / row_bytes, 1, std::max<int64_t>(rows, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
    const int64_t r1 = std::min(rows, r0 + slab_rows);
    std::vector<int64_t> start(t.shape.rank(), 0), stop(t.shape.dims().begin(), t.shape.dims().end());
    start[0] = r0;
    stop[0] = r1;
    const Box slab_box(std::move(start), std::move(stop));
    slab.resize(static_cast<size_t>((r1 - r0) * row_bytes));
    for (const auto& b : blocks)
      for_each_run(b.box.intersect(slab_box), b.box, slab_box, [&](int64_t s, int64_t d, int64_t n) {
        std::memcpy(slab.data() + d * item, b.bytes.data() + s * item, static_cast<size_t>(n * item));
      });
    file.write_at(at + r0 * row_bytes, slab);
  }
}

std::string index_json(const Layout& l) {
  int64_t total = 0;
  for (int64_t b : l.data_bytes) total += b;
  Json weight_map = Json::object();
  std::vector<const Placed*> by_name;
  for (const Placed& t : l.tensors) by_name.push_back(&t);
  std::sort(by_name.begin(), by_name.end(), [](const Placed* a, const Placed* b) { return a->name < b->name; });
  for (const Placed* t : by_name) weight_map[t->name] = l.files[t->file];
  return json_util::dump(Json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}, 2) + "\n";
}

// Every file's header, and its full size (the leader's part).
void create_files(const fs::path& tmp, const Layout& layout) {
  for (size_t f = 0; f < layout.files.size(); ++f) write_header(tmp / layout.files[f], layout.headers[f], layout.data_bytes[f]);
}

// The 8-byte length and the header, where a file's writer puts them itself (an object in a bucket).
void put_header(detail::OutputFile& file, const std::string& header) {
  std::string prefix(8, '\0');
  const uint64_t n = header.size();
  for (size_t i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file.write_at(0, {reinterpret_cast<const std::byte*>(prefix.data()), prefix.size()});
  file.write_at(8, {reinterpret_cast<const std::byte*>(header.data()), header.size()});
}

}  // namespace

struct SafetensorsWriter::Impl {
  SafetensorsSaveOptions options;
  Layout layout;
  std::vector<size_t> placed;  // layout leaf -> its tensor in layout.tensors
  std::vector<std::unique_ptr<detail::OutputFile>> files;
  std::vector<std::byte> slab;
};

SafetensorsWriter::SafetensorsWriter(Location dir, const State& abstract, SafetensorsSaveOptions options,
                                     ProcessGroup* group)
    : StateWriter(std::move(dir), kSafetensorsTmpSuffix, abstract, group, options.durable, /*fixed_shardings=*/false),
      impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  w.options = std::move(options);
  std::vector<std::tuple<std::string, Shape, DType>> arrays;
  for (const auto& [path, v] : layout()) arrays.emplace_back(path, v.shape(), v.dtype());
  w.layout = plan_files(arrays, w.options);  // the same on every process: it depends on shapes alone
  std::map<std::string, size_t> by_path;
  for (size_t i = 0; i < w.layout.tensors.size(); ++i) by_path[w.layout.tensors[i].path] = i;
  for (const std::string& path : paths()) w.placed.push_back(by_path.at(path));
  start();
}

SafetensorsWriter::~SafetensorsWriter() { impl_->files.clear(); }

void SafetensorsWriter::begin_leader() {
  if (tmp().is_local()) create_files(tmp().local(), impl_->layout);
}

void SafetensorsWriter::begin_process() {
  Impl& w = *impl_;
  if (!tmp().is_local() && group().count() > 1)
    throw ValueError("saving '" + dir().string() + "': safetensors in a bucket are written by one process");
  for (size_t f = 0; f < w.layout.files.size(); ++f) {
    if (tmp().is_local()) {
      w.files.push_back(out().open_existing(w.layout.files[f]));
    } else {
      w.files.push_back(out().create(w.layout.files[f]));
      put_header(*w.files.back(), w.layout.headers[f]);
    }
  }
}

void SafetensorsWriter::write_blocks(size_t leaf, std::span<const HostBlock> blocks) {
  Impl& w = *impl_;
  const Placed& t = w.layout.tensors[w.placed[leaf]];
  const int64_t data_start = 8 + static_cast<int64_t>(w.layout.headers[t.file].size());
  write_tensor(*w.files[t.file], data_start + t.begin, t, blocks, w.slab);
}

std::string SafetensorsWriter::finish_process() {
  for (auto& f : impl_->files) f->finish();
  impl_->files.clear();
  return {};
}

void SafetensorsWriter::finish(const std::vector<std::string>&) {
  if (impl_->layout.files.size() > 1) out().write("model.safetensors.index.json", index_json(impl_->layout));
  out().sync();
}

void save_safetensors(const Location& dir, const StagedState& staged, const SafetensorsSaveOptions& options) {
  SafetensorsWriter writer(dir, staged.abstract(), options, &staged.processes());
  staged.write_to(writer);
  writer.commit();
}

void save_safetensors(const Location& dir, const State& state, const SafetensorsSaveOptions& options) {
  save_safetensors(dir, stage_in_place(state), options);
}

}  // namespace tessel
