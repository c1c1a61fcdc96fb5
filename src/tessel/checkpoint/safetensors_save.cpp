// Writing safetensors: the leader lays out every file (tensors ordered by item size, largest
// first, then by name, as the format's own writer does, so each tensor is aligned to its item
// size) and writes the headers; every process then writes its blocks at their offsets, and the
// leader commits the directory by renaming it.
#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/file_io.h"
#include "tessel/checkpoint/detail/item_io.h"
#include "tessel/checkpoint/detail/staged_state.h"
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
  const StagedState::Impl::Param* param;
  std::string name;
  size_t file = 0;
  int64_t begin = 0;  // within the file's data section
  int64_t bytes = 0;
};

struct Layout {
  std::vector<std::string> files;
  std::vector<std::string> headers;  // per file, padded so the data starts 8-byte aligned
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

Layout plan_files(const StagedState::Impl& s, const SafetensorsSaveOptions& options) {
  Layout l;
  for (const auto& p : s.params) {
    safetensors_dtype(p.dtype);  // every tessel dtype has one; checked before anything is written
    l.tensors.push_back({&p, tensor_name(p.path), 0, 0, p.shape.num_elements() * static_cast<int64_t>(item_size(p.dtype))});
  }
  std::sort(l.tensors.begin(), l.tensors.end(), [](const Placed& a, const Placed& b) {
    const size_t ia = item_size(a.param->dtype), ib = item_size(b.param->dtype);
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
    headers[t.file][t.name] = {{"dtype", std::string(safetensors_dtype(t.param->dtype))},
                               {"shape", t.param->shape.dims()},
                               {"data_offsets", {t.begin, t.begin + t.bytes}}};
  for (size_t f = 0; f < n; ++f) {
    std::string text = json_util::dump(headers[f]);
    text.append((8 - text.size() % 8) % 8, ' ');
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
void write_tensor(const detail::File& file, int64_t at, const Placed& t, std::vector<std::byte>& slab) {
  const auto& p = *t.param;
  const int64_t item = static_cast<int64_t>(item_size(p.dtype));
  const Box full = Box::full(p.shape);
  int64_t covered = 0, runs = 0;
  for (const auto& b : p.blocks) {
    covered += b.box.volume();
    for_each_run(b.box, b.box, full, [&](int64_t, int64_t, int64_t) { ++runs; });
  }
  const bool gather = p.shape.rank() > 0 && covered == full.volume() && runs > 0 &&
                      covered * item / runs < (int64_t{64} << 10);
  if (!gather) {
    for (const auto& b : p.blocks)
      for_each_run(b.box, b.box, full, [&](int64_t s, int64_t d, int64_t n) {
        file.write_at(at + d * item, b.bytes.subspan(static_cast<size_t>(s * item), static_cast<size_t>(n * item)));
      });
    return;
  }
  const int64_t rows = p.shape[0];
  const int64_t row_bytes = rows == 0 ? 0 : t.bytes / rows;
  const int64_t slab_rows = std::clamp<int64_t>(row_bytes == 0 ? rows : kSlabBytes / row_bytes, 1, std::max<int64_t>(rows, 1));
  for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
    const int64_t r1 = std::min(rows, r0 + slab_rows);
    std::vector<int64_t> start(p.shape.rank(), 0), stop(p.shape.dims().begin(), p.shape.dims().end());
    start[0] = r0;
    stop[0] = r1;
    const Box slab_box(std::move(start), std::move(stop));
    slab.resize(static_cast<size_t>((r1 - r0) * row_bytes));
    for (const auto& b : p.blocks)
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

}  // namespace

void save_safetensors(const fs::path& dir, const StagedState& staged, const SafetensorsSaveOptions& options) {
  if (options.max_file_bytes < 0) throw ValueError("max_file_bytes must not be negative");
  const StagedState::Impl& s = staged.impl();
  ProcessGroup& group = detail::processes_of(staged);
  const std::string where = "saving '" + dir.string() + "' as safetensors";
  const Layout layout = plan_files(s, options);  // the same on every process: it depends on shapes alone
  const fs::path tmp = fs::path(dir) += kSafetensorsTmpSuffix;
  run_together(group, where, [&] {
    if (!group.is_leader()) return;
    std::error_code ec;
    if (fs::exists(dir, ec)) throw IoError("cannot save to '" + dir.string() + "': it already exists");
    fs::remove_all(tmp, ec);
    if (ec) throw IoError("cannot remove the stale '" + tmp.string() + "': " + ec.message());
    if (!fs::create_directory(tmp, ec) || ec)
      throw IoError("cannot create '" + tmp.string() + "': " + (ec ? ec.message() : "it exists"));
    for (size_t f = 0; f < layout.files.size(); ++f)
      write_header(tmp / layout.files[f], layout.headers[f], layout.data_bytes[f]);
  });
  try {
    run_together(group, where, [&] {
      std::vector<detail::File> files;
      for (const std::string& f : layout.files) files.push_back(detail::File::open_write(tmp / f));
      std::vector<std::byte> slab;
      for (const Placed& t : layout.tensors) {
        const int64_t data_start = 8 + static_cast<int64_t>(layout.headers[t.file].size());
        write_tensor(files[t.file], data_start + t.begin, t, slab);
      }
      for (detail::File& f : files) {
        if (options.durable) f.sync();
        f.close();
      }
    });
    run_together(group, where, [&] {
      if (!group.is_leader()) return;
      if (layout.files.size() > 1) detail::write_file(tmp / "model.safetensors.index.json", index_json(layout), options.durable);
      if (options.durable) detail::sync_directory(tmp);
      std::error_code ec;
      if (fs::exists(dir, ec)) throw IoError("cannot commit '" + dir.string() + "': it already exists");
      fs::rename(tmp, dir, ec);
      if (ec) throw IoError("cannot rename '" + tmp.string() + "' to '" + dir.string() + "': " + ec.message());
      if (options.durable) detail::sync_directory(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
    });
  } catch (...) {
    std::error_code ec;
    if (group.is_leader()) fs::remove_all(tmp, ec);
    throw;
  }
}

void save_safetensors(const fs::path& dir, const State& state, const SafetensorsSaveOptions& options) {
  save_safetensors(dir, detail::stage_in_place(state), options);
}

}  // namespace tessel
