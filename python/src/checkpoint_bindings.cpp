// The checkpoint layer for Python, flat: leaves are (path, ...) records and blocks are raw bytes;
// tessel/checkpoint.py builds trees, dtypes and jax.Arrays on top. Blocks cross the boundary
// without copies: a save reads the callers' arrays in place, a restore hands out read-only views
// of the device buffers it filled (each view keeps its buffer alive). The GIL is released while
// files are read or written.
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>

#include "bindings.h"
#include "convert.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/error.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/runtime.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BytesOut = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>;

// A read-only uint8 view of a device buffer; the view owns a reference to it.
BytesOut view(const Buffer& buffer) {
  static const uint8_t empty = 0;
  auto* owner = new Buffer(buffer);
  nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<Buffer*>(p); });
  const size_t n = static_cast<size_t>(buffer.size());
  const void* data = n ? static_cast<const void*>(buffer.data()) : &empty;
  return BytesOut(data, {n}, keep);
}

// Devices the runtime must have for these meshes: ids 0 .. max id.
int64_t devices_for(const std::vector<const Mesh*>& meshes) {
  int64_t n = 1;
  for (const Mesh* m : meshes) {
    for (int64_t d : m->device_ids()) n = std::max(n, d + 1);
  }
  return n;
}

// save(): leaves are (path, dtype name, shape, sharding, [(block start, raw bytes)], logical axes or None).
std::vector<HostLeaf> host_leaves(nb::list leaves) {
  std::vector<HostLeaf> host;
  for (nb::handle h : leaves) {
    nb::tuple leaf = nb::borrow<nb::tuple>(h);
    if (leaf.size() != 6) throw ValueError("save: each leaf record has 6 fields");
    const std::string path = nb::cast<std::string>(leaf[0]);
    HostLeaf l{path, to_shape(leaf[2], path + " shape"), parse_dtype(nb::cast<std::string>(leaf[1])),
               nb::cast<NamedSharding>(leaf[3]), {}, kParam, {}};
    for (nb::handle b : nb::borrow<nb::list>(leaf[4])) {
      nb::tuple block = nb::borrow<nb::tuple>(b);
      const Shape start = to_shape(block[0], path + " block start");
      const Shape extent = to_shape(block[1], path + " block shape");
      if (start.rank() != extent.rank()) throw ValueError(path + ": block start and shape differ in rank");
      std::vector<int64_t> stop(start.rank());
      for (size_t d = 0; d < start.rank(); ++d) stop[d] = start[d] + extent[d];
      Bytes bytes = nb::cast<Bytes>(block[2]);
      l.blocks.emplace_back(Box(start.dims(), std::move(stop)),
                            std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
    }
    if (!leaf[5].is_none()) l.partitioning = Partitioning::by_logical(to_logical(leaf[5], path + " logical axes"));
    host.push_back(std::move(l));
  }
  return host;
}

void save_leaves(const std::string& dir, nb::list leaves, const std::string& compression, bool use_ocdbt,
                 bool use_zarr3, int64_t max_chunk_bytes, std::optional<LogicalRules> rules,
                 std::vector<std::string> sequence_nodes) {
  std::vector<HostLeaf> host = host_leaves(leaves);
  SaveOptions options;
  options.compression = Compression::parse(compression);
  options.use_ocdbt = use_ocdbt;
  options.use_zarr3 = use_zarr3;
  options.max_chunk_bytes = max_chunk_bytes;
  options.rules = std::move(rules);
  options.sequence_nodes = {sequence_nodes.begin(), sequence_nodes.end()};
  StagedState staged = stage_host(std::move(host));
  nb::gil_scoped_release release;
  save(dir, staged, options);
}

void save_safetensors_leaves(const std::string& dir, nb::list leaves, int64_t max_file_bytes,
                             std::map<std::string, std::string> metadata) {
  SafetensorsSaveOptions options;
  options.max_file_bytes = max_file_bytes;
  options.metadata = std::move(metadata);
  StagedState staged = stage_host(host_leaves(leaves));
  nb::gil_scoped_release release;
  save_safetensors(dir, staged, options);
}

// restore(): target leaves are (path, sharding, dtype name or None); returns per leaf
// (path, dtype name, shape, sharding, [(device, replica id, block start, block shape, raw bytes)]).
nb::list restore_leaves(const std::string& item_dir, nb::list target_leaves, int64_t staging_bytes) {
  State target;
  std::vector<const Mesh*> meshes;
  const State saved = saved_abstract_state(item_dir);
  for (nb::handle h : target_leaves) {
    nb::tuple t = nb::borrow<nb::tuple>(h);
    const std::string path = nb::cast<std::string>(t[0]);
    const Variable& v = saved.at(path);
    const DType dtype = t[2].is_none() ? v.dtype() : parse_dtype(nb::cast<std::string>(t[2]));
    target.insert(path, Variable::abstract(v.kind(), v.shape(), dtype, nb::cast<NamedSharding>(t[1]), v.partitioning()));
  }
  for (const auto& [path, v] : target) meshes.push_back(&v.sharding()->mesh());
  RestoreOptions options;
  options.partial = true;
  options.staging_bytes = staging_bytes;
  std::optional<State> restored;
  {
    nb::gil_scoped_release release;
    Runtime rt = Runtime::host(devices_for(meshes));
    restored = restore(rt, item_dir, target, options);
  }
  nb::list out;
  for (const auto& [path, v] : *restored) {
    const Array& a = v.array(path);
    nb::list blocks;
    for (const Shard& s : a.shards()) {
      blocks.append(nb::make_tuple(s.device, s.replica_id, from_shape(Shape(std::vector<int64_t>(s.box.starts().begin(), s.box.starts().end()))),
                                   from_shape(s.box.shape()), view(s.buffer)));
    }
    out.append(nb::make_tuple(path, std::string(name(a.dtype())), from_shape(a.shape()), a.sharding(), blocks));
  }
  return out;
}

// Every saved leaf: (path, dtype name, shape, saved sharding or None, logical axes / mesh spec or
// None, key types).
nb::list saved_leaves(const std::string& item_dir) {
  const ItemMetadata meta = read_item_metadata(item_dir);
  const State saved = saved_abstract_state(item_dir);
  nb::list out;
  for (const auto& [path, v] : saved) {
    const ParamMetadata* p = meta.find(path);
    nb::object sharding = v.sharding() ? nb::cast(*v.sharding()) : nb::none();
    out.append(nb::make_tuple(path, std::string(name(v.dtype())), from_shape(v.shape()), sharding,
                              from_partitioning(v.partitioning()),
                              p ? nb::cast(p->key_types) : nb::cast(std::vector<int>{})));
  }
  return out;
}

nb::list target_leaves(const std::string& item_dir, const Mesh& mesh, std::optional<LogicalRules> rules,
                       std::vector<std::string> paths, std::map<std::string, std::string> axis_map,
                       nb::dict logical_axes) {
  TargetOptions options;
  options.rules = std::move(rules);
  options.paths = std::move(paths);
  options.axis_map = std::move(axis_map);
  for (auto [path, names] : logical_axes) {
    const std::string p = path_from_dump_key(nb::cast<std::string>(path));
    options.logical_axes.emplace(p, to_logical(names, p + " logical axes"));
  }
  nb::list out;
  for (const auto& [path, v] : restore_target(item_dir, mesh, options)) out.append(nb::make_tuple(path, *v.sharding()));
  return out;
}

nb::list describe(const std::string& item_dir) {
  nb::list out;
  for (const SavedArrayInfo& i : describe_item(item_dir)) {
    nb::dict d;
    d["path"] = i.param.path;
    d["name"] = i.param.name;
    d["dtype"] = std::string(name(i.dtype));
    d["shape"] = from_shape(i.shape);
    d["chunk_shape"] = from_shape(i.chunks);
    d["num_chunks"] = i.num_chunks;
    d["stored_bytes"] = i.stored_bytes;
    d["compression"] = i.compression.to_string();
    d["saved_sharding"] = i.param.sharding ? nb::cast(NamedSharding(i.param.sharding->mesh, i.param.sharding->spec)) : nb::none();
    d["logical_axes"] = from_partitioning(i.param.partitioning);
    out.append(d);
  }
  return out;
}

nb::dict verify_item(const std::string& item_dir) {
  VerifyReport r;
  {
    nb::gil_scoped_release release;
    r = verify(item_dir);
  }
  nb::dict d;
  d["faults"] = nb::cast(r.faults);
  d["arrays"] = r.arrays;
  d["chunks"] = r.chunks;
  d["bytes"] = r.bytes;
  d["checksums"] = r.checksums;
  return d;
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  m.def("find_item_dir",
        [](const std::string& path, std::optional<int64_t> step, std::optional<std::string> item) {
          return find_item_dir(path, step, item).string();
        },
        "path"_a, "step"_a = nb::none(), "item"_a = nb::none());
  m.def("list_steps", [](const std::string& root) { return list_steps(root); }, "root"_a);
  m.def("list_items",
        [](const std::string& step_dir) {
          nb::list out;
          for (const ItemInfo& i : list_items(step_dir)) out.append(nb::make_tuple(i.name, i.handler, i.holds_arrays));
          return out;
        },
        "step_dir"_a);
  m.def("item_storage", [](const std::string& item_dir) {
    const ItemMetadata meta = read_item_metadata(item_dir);
    return nb::make_tuple(meta.use_ocdbt, meta.use_zarr3, meta.rules ? nb::cast(*meta.rules) : nb::none(),
                          meta.format == StorageFormat::kSafetensors ? "safetensors" : "orbax", meta.format_metadata);
  });
  m.def("save_leaves", &save_leaves, "dir"_a, "leaves"_a, "compression"_a, "use_ocdbt"_a, "use_zarr3"_a,
        "max_chunk_bytes"_a, "rules"_a, "sequence_nodes"_a);
  m.def("save_safetensors_leaves", &save_safetensors_leaves, "dir"_a, "leaves"_a, "max_file_bytes"_a, "metadata"_a);
  m.def("restore_leaves", &restore_leaves, "item_dir"_a, "target"_a, "staging_bytes"_a);
  m.def("saved_leaves", &saved_leaves, "item_dir"_a);
  m.def("target_leaves", &target_leaves, "item_dir"_a, "mesh"_a, "rules"_a, "paths"_a,
        "axis_map"_a = std::map<std::string, std::string>{}, "logical_axes"_a = nb::dict());
  m.def("load_target_logical_axes", [](const std::string& file) {
    nb::dict out;
    for (const auto& [path, names] : load_target_logical_axes(file)) out[path.c_str()] = from_logical(names);
    return out;
  });
  m.def("describe", &describe, "item_dir"_a);
  m.def("verify", &verify_item, "item_dir"_a);
}

}  // namespace tessel::python
