// The checkpoint layer for Python: tessel/checkpoint.py builds trees, dtypes and jax.Arrays on
// top. Each call does one whole job in C++ (a restore opens the item, builds the target and reads
// it in one call) and returns records with named fields. Blocks cross the boundary without
// copies: a save reads the callers' arrays in place, a restore hands out read-only views of the
// device buffers it filled (each view keeps its buffer alive). The GIL is released while files
// are read or written.
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>

#include "bindings.h"
#include "convert.h"
#include "job.h"
#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/convert.h"
#include "tessel/checkpoint/item.h"
#include "tessel/checkpoint/items.h"
#include "tessel/checkpoint/safetensors.h"
#include "tessel/checkpoint/target.h"
#include "tessel/core/error.h"
#include "tessel/core/location.h"
#include "tessel/core/path.h"
#include "tessel/models/maxtext_checkpoint.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/runtime.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {
namespace fs = std::filesystem;

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

template <class Dims>
std::vector<int64_t> dims_of(const Dims& dims) {
  return {dims.begin(), dims.end()};
}

// One device's block of a restored array.
struct RestoredBlock {
  int64_t device = 0;
  int64_t replica_id = 0;
  std::vector<int64_t> start, shape;
  nb::object data;  // view(buffer)
};

struct RestoredArray {
  std::string path;  // after the renames
  std::string saved_path;
  std::string dtype;
  std::vector<int64_t> shape;
  NamedSharding sharding;
  std::vector<RestoredBlock> blocks;
};

// What restore returns: the arrays, and Orbax's key type of every node of the restored tree by
// its path ("" the root), so that Python rebuilds lists where Orbax recorded sequences.
struct Restored {
  std::vector<RestoredArray> arrays;
  std::map<std::string, int> key_types;
  RestoreStats stats;
};

// save(): each leaf is a dict {"path", "dtype", "shape", "sharding", "blocks": [(start, shape,
// raw bytes)], "logical_axes" (or None)}.
nb::handle field(nb::dict leaf, const char* key) {
  if (!leaf.contains(key)) throw ValueError(std::string("save: a leaf record has no '") + key + "'");
  return leaf[key];
}

std::vector<HostLeaf> host_leaves(nb::list leaves) {
  std::vector<HostLeaf> host;
  for (nb::handle h : leaves) {
    if (!nb::isinstance<nb::dict>(h)) throw ValueError("save: a leaf record must be a dict, not " + repr_of(h));
    nb::dict leaf = nb::borrow<nb::dict>(h);
    const std::string path = nb::cast<std::string>(field(leaf, "path"));
    HostLeaf l{path, to_shape(field(leaf, "shape"), path + " shape"), parse_dtype(nb::cast<std::string>(field(leaf, "dtype"))),
               nb::cast<NamedSharding>(field(leaf, "sharding")), {}, kParam, {}};
    for (nb::handle b : nb::cast<nb::list>(field(leaf, "blocks"))) {
      if (!nb::isinstance<nb::tuple>(b) || nb::len(b) != 3)
        throw ValueError(path + ": a block must be a (start, shape, bytes) tuple, not " + repr_of(b));
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
    if (leaf.contains("logical_axes") && !leaf["logical_axes"].is_none())
      l.partitioning = Partitioning::by_logical(to_logical(leaf["logical_axes"], path + " logical axes"));
    host.push_back(std::move(l));
  }
  return host;
}

// A new directory: local, its parents created as Orbax does, or a bucket prefix (`what` names the
// argument in the error for any other URL).
Location new_dir(const std::string& path, const char* what) {
  const Location dir = Location::parse(path, what);
  if (!dir.is_local()) return dir;
  const fs::path parent = fs::absolute(dir.local()).parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw IoError("cannot create '" + parent.string() + "': " + ec.message());
  return dir;
}

// save(): in a multi-process job `group` is tessel._job's meeting object (index, count,
// all_gather) and `local_devices` the ids of this process's devices; None alone.
void save_leaves(const std::string& path, nb::list leaves, const std::string& compression, bool use_ocdbt,
                 bool use_zarr3, int64_t max_chunk_bytes, std::optional<LogicalRules> rules,
                 std::vector<std::string> sequence_nodes, nb::object group, std::vector<int64_t> local_devices) {
  (void)Location::parse(path, "path");  // a bad URL before the leaves are staged
  std::vector<HostLeaf> host = host_leaves(leaves);
  std::optional<PythonProcessGroup> job;
  HostProcesses processes;
  if (!group.is_none()) {
    job.emplace(group, nb::cast<int>(group.attr("index")), nb::cast<int>(group.attr("count")));
    processes = {&*job, {local_devices.begin(), local_devices.end()}};
  }
  SaveOptions options;
  options.compression = Compression::parse(compression);
  options.use_ocdbt = use_ocdbt;
  options.use_zarr3 = use_zarr3;
  options.max_chunk_bytes = max_chunk_bytes;
  options.rules = std::move(rules);
  options.sequence_nodes = {sequence_nodes.begin(), sequence_nodes.end()};
  StagedState staged = stage_host(std::move(host), processes);
  nb::gil_scoped_release release;
  // Every process creates the parents (they may not share them); the leader alone commits.
  save(new_dir(path, "path"), staged, options);
}

void save_safetensors_leaves(const std::string& path, nb::list leaves, int64_t max_file_bytes,
                             std::map<std::string, std::string> metadata) {
  (void)Location::parse(path, "path");  // a bad URL before the leaves are staged
  SafetensorsSaveOptions options;
  options.max_file_bytes = max_file_bytes;
  options.metadata = std::move(metadata);
  StagedState staged = stage_host(host_leaves(leaves));
  nb::gil_scoped_release release;
  save_safetensors(new_dir(path, "path"), staged, options);
}

Placement parse_placement(const std::string& name) {
  if (name == "mesh") return Placement::kMesh;
  if (name == "as_saved") return Placement::kAsSaved;
  if (name == "as_saved_or_one_device") return Placement::kAsSavedOrOneDevice;
  if (name == "replicated") return Placement::kReplicated;
  throw ValueError("placement must be mesh, as_saved, as_saved_or_one_device or replicated, not '" + name + "'");
}

// Devices the runtime must have for these shardings: ids 0 .. max id.
int64_t devices_for(const State& target) {
  int64_t n = 1;
  for (const auto& [path, v] : target)
    for (int64_t d : v.sharding()->mesh().device_ids()) n = std::max(n, d + 1);
  return n;
}

// The key type of every node of the restored tree: the saved leaves' key types, recorded at
// their parent nodes, moved by the renames as the leaves are.
std::map<std::string, int> key_types_of(const CheckpointItem& item, const State& target,
                                        const std::vector<std::pair<std::string, std::string>>& renames) {
  std::map<std::string, int> out;
  for (const auto& [path, v] : target) {
    const ParamMetadata* p = item.metadata().find(path);
    std::string node;
    for (size_t i = 0; i < p->keys.size() && i < p->key_types.size(); ++i) {
      const std::string moved = node.empty() ? node : rename_path(node, renames);
      if (node.empty() || !moved.empty()) out[moved] = p->key_types[i];
      node += (node.empty() ? "" : "/") + p->keys[i];
    }
  }
  return out;
}

// restore(): the item `path` names (step, item), the leaves `select`/`paths` choose, placed by
// the target ladder (see TargetSpec), restored onto devices in one call.
Restored restore_item(const std::string& path, std::optional<int64_t> step, std::optional<std::string> item_name,
                      std::optional<Mesh> mesh, std::optional<LogicalRules> rules,
                      std::map<std::string, NamedSharding> shardings, std::map<std::string, std::string> dtypes,
                      nb::dict logical_axes, std::optional<std::string> logical_axes_file,
                      std::map<std::string, std::string> axis_map, std::vector<std::string> select,
                      std::vector<std::pair<std::string, std::string>> rename, const std::string& placement,
                      int64_t staging_bytes, std::vector<int64_t> job_devices, std::vector<int> job_processes,
                      int process_index) {
  const Location given = Location::parse(path, "path");
  TargetSpec spec;
  spec.mesh = std::move(mesh);
  spec.rules = std::move(rules);
  spec.shardings = std::move(shardings);
  for (const auto& [p, name] : dtypes) spec.dtypes.emplace(p, parse_dtype(name));
  for (auto [p, names] : logical_axes) {
    const std::string key = path_from_dump_key(nb::cast<std::string>(p));
    spec.logical_axes.emplace(key, to_logical(names, key + " logical axes"));
  }
  if (logical_axes_file) spec.logical_axes = load_target_logical_axes(local_path(*logical_axes_file, "logical_axes"));
  spec.axis_map = std::move(axis_map);
  spec.select = std::move(select);
  spec.rename = std::move(rename);
  spec.placement = parse_placement(placement);
  if (!spec.mesh && (!spec.axis_map.empty() || !spec.logical_axes.empty()))
    throw ValueError("axis_map and logical_axes place arrays on a mesh: give mesh=");
  RestoreOptions options;
  options.partial = true;
  options.staging_bytes = staging_bytes;
  Restored out;
  std::optional<State> restored;
  std::optional<JobDevices> job;
  std::map<std::string, NamedSharding> job_shardings;  // the target's, in the job's device ids
  {
    nb::gil_scoped_release release;
    const CheckpointItem item = CheckpointItem::find(given, step, item_name);
    const State target = make_target(item, spec);
    if (!spec.rename.empty()) (void)rename_prefixes(target, spec.rename);  // no two paths become one
    out.key_types = key_types_of(item, target, spec.rename);
    if (job_devices.empty()) {
      restored = restore(Runtime::host(devices_for(target)), item, target, options, &out.stats);
    } else {
      // A multi-process job: the target on the positions of the job's devices, each process
      // reading the blocks of its own devices only.
      job = JobDevices{std::move(job_devices), std::move(job_processes), process_index};
      job->check();
      State placed;
      for (const auto& [p, v] : target) {
        job_shardings.emplace(p, *v.sharding());
        placed.insert(p, Variable::abstract(v.kind(), v.shape(), v.dtype(), job->to_positions(*v.sharding(), "'" + p + "'"),
                                            v.partitioning()));
      }
      restored = restore(Runtime::part_of_job(job->processes, job->process_index), item, placed, options, &out.stats);
    }
  }
  for (const auto& [p, v] : *restored) {
    const Array& a = v.array(p);
    RestoredArray r{rename_path(p, spec.rename), p, std::string(name(a.dtype())), dims_of(a.shape().dims()),
                    job ? job_shardings.at(p) : a.sharding(), {}};
    for (const Shard& s : a.shards()) {
      if (!s.is_addressable()) continue;  // another process's
      r.blocks.push_back({job ? job->id_at(s.device) : s.device, s.replica_id, dims_of(s.box.starts()),
                          dims_of(s.box.shape().dims()), nb::cast(view(s.buffer))});
    }
    out.arrays.push_back(std::move(r));
  }
  return out;
}

// One saved array as `tessel ckpt info` shows it.
struct ArrayInfo {
  std::string path, name, dtype, compression;
  std::vector<int64_t> shape, chunk_shape;
  int64_t num_chunks = 0, stored_bytes = 0;
  std::optional<NamedSharding> saved_sharding;
  Partitioning logical_axes;
};

// An opened item for inspection: where it is, how it is stored, its arrays.
struct ItemView {
  CheckpointItem item;
  std::string dir() const { return item.dir().string(); }
  std::vector<ArrayInfo> arrays() const {
    std::vector<ArrayInfo> out;
    for (const SavedArrayInfo& i : item.describe()) {
      std::optional<NamedSharding> saved;
      if (i.param.sharding) saved = NamedSharding(i.param.sharding->mesh, i.param.sharding->spec);
      out.push_back({i.param.path, i.param.name, std::string(name(i.dtype)), i.compression.to_string(),
                     dims_of(i.shape.dims()), dims_of(i.chunks.dims()), i.num_chunks, i.stored_bytes, saved,
                     i.param.partitioning});
    }
    return out;
  }
};

// convert(): the library's conversion (checkpoint/convert.h) from Python's arguments; returns the
// format written.
std::string convert_item(const std::string& src, const std::string& dst, std::optional<int64_t> step,
                         std::optional<std::string> item_name, std::optional<std::string> to, std::optional<Mesh> mesh,
                         std::optional<LogicalRules> rules, std::optional<std::string> dtype,
                         std::vector<std::string> select, std::vector<std::pair<std::string, std::string>> rename,
                         std::optional<std::string> map, std::map<std::string, std::string> map_vars,
                         int64_t max_file_bytes, const std::string& compression, bool use_ocdbt, bool use_zarr3,
                         int64_t memory_bytes) {
  const Location from = Location::parse(src, "src"), into = Location::parse(dst, "dst");
  if (to && *to != "orbax" && *to != "safetensors" && *to != "maxtext-params")
    throw ValueError("to must be 'orbax', 'safetensors' or 'maxtext-params', not '" + *to + "'");
  if (max_file_bytes < 0 || max_file_bytes % (int64_t{1} << 20) != 0)
    throw ValueError("max_file_bytes must be a non-negative multiple of 1 MiB, not " + std::to_string(max_file_bytes));
  if (memory_bytes < 1) throw ValueError("memory_mb must be positive, not " + std::to_string(memory_bytes >> 20));
  const std::optional<fs::path> map_file = map ? std::optional(local_path(*map, "map")) : std::nullopt;
  nb::gil_scoped_release release;
  const CheckpointItem item = CheckpointItem::find(from, step, item_name);
  ConvertOptions o;
  if (to == "orbax") o.to = CheckpointFormat::kOrbax;
  if (to == "safetensors") o.to = CheckpointFormat::kSafetensors;
  if (dtype) o.dtype = parse_dtype(*dtype);
  o.target.rules = rules ? rules : item.metadata().rules;
  if (mesh) {
    // Axes the rules declare and the mesh lacks get size 1, in the rules' order (as --mesh).
    const std::vector<std::string>& declared = o.target.rules ? o.target.rules->mesh_axes() : std::vector<std::string>{};
    std::string text;
    for (const MeshAxis& a : mesh->axes()) text += (text.empty() ? "" : ",") + a.name + "=" + std::to_string(a.size);
    o.target.mesh = declared.empty() ? *mesh : Mesh::parse(text, declared);
  }
  o.target.select = std::move(select);
  o.target.rename = std::move(rename);
  if (map_file) o.map = load_key_map(*map_file, map_vars);
  o.orbax.compression = Compression::parse(compression);
  o.orbax.use_ocdbt = use_ocdbt;
  o.orbax.use_zarr3 = use_zarr3;
  o.safetensors = SafetensorsSaveOptions{.max_file_bytes = max_file_bytes, .metadata = {{"format", "pt"}}};
  o.batch_bytes = memory_bytes;
  if (to == "maxtext-params") o = maxtext_params_conversion(item, std::move(o));
  const Runtime rt = Runtime::host(o.target.mesh ? o.target.mesh->device_count() : 1);
  const ConvertReport r = convert(rt, item, into, o);
  return r.written == CheckpointFormat::kSafetensors ? "safetensors" : "orbax";
}

ItemView open_item(const std::string& path, std::optional<int64_t> step, std::optional<std::string> item) {
  const Location given = Location::parse(path, "path");
  nb::gil_scoped_release release;
  return {CheckpointItem::find(given, step, item)};
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  nb::class_<RestoredBlock>(m, "RestoredBlock", "One device's block of a restored array.")
      .def_ro("device", &RestoredBlock::device)
      .def_ro("replica_id", &RestoredBlock::replica_id)
      .def_ro("start", &RestoredBlock::start)
      .def_ro("shape", &RestoredBlock::shape)
      .def_ro("data", &RestoredBlock::data, "Its bytes, read-only (uint8).");
  nb::class_<RestoredArray>(m, "RestoredArray", "A restored array: its path, dtype, shape, sharding and blocks.")
      .def_ro("path", &RestoredArray::path)
      .def_ro("saved_path", &RestoredArray::saved_path)
      .def_ro("dtype", &RestoredArray::dtype)
      .def_ro("shape", &RestoredArray::shape)
      .def_ro("sharding", &RestoredArray::sharding)
      .def_ro("blocks", &RestoredArray::blocks);
  nb::class_<Restored>(m, "Restored")
      .def_ro("arrays", &Restored::arrays)
      .def_ro("key_types", &Restored::key_types)
      .def_prop_ro("stats", [](const Restored& r) {
        const RestoreStats& s = r.stats;
        nb::dict d;
        d["bytes_read"] = s.bytes_read;
        d["chunks_read"] = s.chunks_read;
        d["target_bytes"] = s.target_bytes;
        d["seconds"] = s.seconds;
        return d;
      });
  nb::class_<ArrayInfo>(m, "ArrayInfo", "One saved array: what `tessel ckpt info` shows.")
      .def_ro("path", &ArrayInfo::path)
      .def_ro("name", &ArrayInfo::name)
      .def_ro("dtype", &ArrayInfo::dtype)
      .def_ro("shape", &ArrayInfo::shape)
      .def_ro("chunk_shape", &ArrayInfo::chunk_shape)
      .def_ro("num_chunks", &ArrayInfo::num_chunks)
      .def_ro("stored_bytes", &ArrayInfo::stored_bytes)
      .def_ro("compression", &ArrayInfo::compression)
      .def_ro("saved_sharding", &ArrayInfo::saved_sharding)
      .def_prop_ro("logical_axes", [](const ArrayInfo& a) { return from_partitioning(a.logical_axes); });
  nb::class_<VerifyReport>(m, "VerifyReport", "What verify read and the faults it found.")
      .def_ro("faults", &VerifyReport::faults)
      .def_ro("arrays", &VerifyReport::arrays)
      .def_ro("chunks", &VerifyReport::chunks)
      .def_ro("bytes", &VerifyReport::bytes)
      .def_ro("checksums", &VerifyReport::checksums)
      .def_ro("unchecked", &VerifyReport::unchecked);
  nb::class_<ItemView>(m, "Item", "An opened checkpoint item.")
      .def_prop_ro("dir", &ItemView::dir)
      .def_prop_ro("storage", [](const ItemView& v) { return v.item.storage(); })
      .def_prop_ro("format", [](const ItemView& v) {
        return std::string(v.item.format() == StorageFormat::kSafetensors ? "safetensors" : "orbax");
      })
      .def_prop_ro("rules", [](const ItemView& v) { return v.item.metadata().rules; })
      .def_prop_ro("metadata", [](const ItemView& v) { return v.item.metadata().format_metadata; })
      .def("arrays", &ItemView::arrays)
      .def("verify", [](const ItemView& v) {
        nb::gil_scoped_release release;
        return verify(v.item);
      });

  m.def("open_item", &open_item, "path"_a, "step"_a = nb::none(), "item"_a = nb::none());
  m.def("convert", &convert_item, "src"_a, "dst"_a, "step"_a, "item"_a, "to"_a, "mesh"_a, "rules"_a, "dtype"_a,
        "select"_a, "rename"_a, "map"_a, "map_vars"_a, "max_file_bytes"_a, "compression"_a, "use_ocdbt"_a,
        "use_zarr3"_a, "memory_bytes"_a);
  m.def("list_steps", [](const std::string& root) { return list_steps(Location::parse(root, "root")); }, "root"_a);
  nb::class_<ItemInfo>(m, "ItemInfo", "One item of an Orbax step directory.")
      .def_ro("name", &ItemInfo::name)
      .def_ro("handler", &ItemInfo::handler)
      .def_ro("holds_arrays", &ItemInfo::holds_arrays);
  m.def("list_items", [](const std::string& step_dir) { return list_items(Location::parse(step_dir, "step_dir")); },
        "step_dir"_a);
  m.def("save_leaves", &save_leaves, "path"_a, "leaves"_a, "compression"_a, "use_ocdbt"_a, "use_zarr3"_a,
        "max_chunk_bytes"_a, "rules"_a, "sequence_nodes"_a, "group"_a = nb::none(),
        "local_devices"_a = std::vector<int64_t>{});
  m.def("save_safetensors_leaves", &save_safetensors_leaves, "path"_a, "leaves"_a, "max_file_bytes"_a, "metadata"_a);
  m.def("restore", &restore_item, "path"_a, "step"_a, "item"_a, "mesh"_a, "rules"_a, "shardings"_a, "dtypes"_a,
        "logical_axes"_a, "logical_axes_file"_a, "axis_map"_a, "select"_a, "rename"_a, "placement"_a,
        "staging_bytes"_a, "job_devices"_a = std::vector<int64_t>{}, "job_processes"_a = std::vector<int>{},
        "process_index"_a = 0);
}

}  // namespace tessel::python
