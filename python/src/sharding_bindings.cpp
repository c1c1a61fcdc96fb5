// Mesh, PartitionSpec, NamedSharding and LogicalRules for Python, with JAX's spellings: a spec
// entry is None, "axis" or ("a", "b"); devices_indices_map gives tuples of slices.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "bindings.h"
#include "convert.h"
#include "tessel/core/error.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/mesh.h"
#include "tessel/sharding/named_sharding.h"
#include "tessel/sharding/partition_spec.h"
#include "tessel/sharding/rules_io.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

// {"data": 2, "fsdp": 4} or [("data", 2), ("fsdp", 4)], in order.
std::vector<MeshAxis> to_axes(nb::handle axes) {
  std::vector<MeshAxis> out;
  auto add = [&](nb::handle name, nb::handle size) {
    if (!nb::isinstance<nb::str>(name)) throw ValueError("Mesh: axis name " + repr_of(name) + " is not a string");
    if (!nb::isinstance<nb::int_>(size)) throw ValueError("Mesh: the size of axis " + repr_of(name) + " is not an int");
    out.push_back({nb::cast<std::string>(name), nb::cast<int64_t>(size)});
  };
  if (nb::isinstance<nb::dict>(axes)) {
    for (auto [name, size] : nb::borrow<nb::dict>(axes)) add(name, size);
    return out;
  }
  if (nb::isinstance<nb::str>(axes)) throw ValueError("Mesh: give axes as a dict or pairs; use Mesh.parse for text");
  for (nb::handle pair : axes) {
    nb::tuple t = nb::tuple(pair);
    if (t.size() != 2) throw ValueError("Mesh: each axis must be a (name, size) pair, not " + repr_of(pair));
    add(t[0], t[1]);
  }
  return out;
}

PartitionSpec to_spec(nb::args dims) {
  std::vector<DimSharding> out;
  for (size_t i = 0; i < dims.size(); ++i) out.push_back(to_dim(dims[i], "PartitionSpec entry " + std::to_string(i)));
  return PartitionSpec(std::move(out));
}

nb::tuple spec_entries(const PartitionSpec& spec) {
  nb::list out;
  for (const auto& d : spec.dims()) out.append(from_dim(d));
  return nb::tuple(out);
}

// Flax's rule list: (logical name, None | "axis" | ("a", "b")) pairs.
std::vector<LogicalRule> to_rules(nb::handle rules) {
  std::vector<LogicalRule> out;
  size_t i = 0;
  for (nb::handle r : rules) {
    const std::string what = "rule " + std::to_string(i++);
    nb::tuple pair = nb::tuple(r);
    if (pair.size() != 2 || !nb::isinstance<nb::str>(pair[0])) {
      throw ValueError(what + ": expected a (logical name, mesh axes) pair, not " + repr_of(r));
    }
    out.push_back({nb::cast<std::string>(pair[0]), to_dim(pair[1], what), 0});
  }
  return out;
}

ResolveOptions options(bool remove_size_one_axes, bool drop_indivisible, bool strict) {
  ResolveOptions o;
  o.remove_size_one_axes = remove_size_one_axes;
  o.drop_indivisible = drop_indivisible;
  o.strict = strict;
  return o;
}

std::optional<Shape> optional_shape(nb::handle shape) {
  if (shape.is_none()) return std::nullopt;
  return to_shape(shape);
}

}  // namespace

void bind_sharding(nb::module_& m) {
  nb::class_<Mesh>(m, "Mesh",
                   "Named axes over a grid of device ids, laid out row-major (the last axis varies fastest), as in JAX.")
      .def(
          "__init__",
          [](Mesh* self, nb::handle axes, std::optional<std::vector<int64_t>> device_ids) {
            if (device_ids) new (self) Mesh(to_axes(axes), std::move(*device_ids));
            else new (self) Mesh(to_axes(axes));
          },
          "axes"_a, "device_ids"_a = nb::none(),
          "Mesh({'data': 2, 'fsdp': 4}) over devices 0..7, or over the given device ids in row-major order.")
      .def_static("parse", [](const std::string& text) { return Mesh::parse(text); }, "text"_a,
                  "Mesh.parse('data=2,fsdp=4')")
      .def_prop_ro("axis_names", [](const Mesh& m) { return nb::tuple(nb::cast(m.axis_names())); })
      .def_prop_ro("shape",
                   [](const Mesh& m) {
                     nb::dict d;
                     for (const auto& a : m.axes()) d[a.name.c_str()] = a.size;
                     return d;
                   },
                   "{axis name: size}, in axis order")
      .def_prop_ro("device_ids", [](const Mesh& m) { return nb::tuple(nb::cast(m.device_ids())); })
      .def_prop_ro("size", &Mesh::device_count)
      .def("coords", [](const Mesh& m, int64_t device) { return nb::tuple(nb::cast(m.coords(device))); }, "device"_a,
           "The device's coordinate along every axis.")
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__eq__", [](const Mesh&, nb::handle) { return false; })
      .def("__hash__", [](const Mesh& m) { return nb::hash(nb::str(m.to_string().c_str())); })
      .def("__repr__", &Mesh::to_string);

  nb::class_<PartitionSpec>(m, "PartitionSpec",
                            "Per dimension: None (unsharded), a mesh axis, or a tuple of axes (major first). Stored "
                            "JAX-normalized: a 1-tuple is the axis, an empty tuple is None.")
      .def("__init__", [](PartitionSpec* self, nb::args dims) { new (self) PartitionSpec(to_spec(dims)); })
      .def_static("from_json", [](const std::string& text) { return PartitionSpec::from_json(text); }, "text"_a,
                  "From MaxText's JSON form: [\"fsdp\", null, [\"a\", \"b\"]]")
      .def("to_json", &PartitionSpec::to_json)
      .def("__len__", &PartitionSpec::size)
      .def("__getitem__",
           [](const PartitionSpec& s, int64_t i) {
             const int64_t n = static_cast<int64_t>(s.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw nb::index_error("PartitionSpec index out of range");
             return from_dim(s[static_cast<size_t>(i)]);
           })
      .def("__iter__", [](const PartitionSpec& s) { return spec_entries(s).attr("__iter__")(); })
      .def("__eq__", [](const PartitionSpec& a, const PartitionSpec& b) { return a == b; })
      .def("__eq__", [](const PartitionSpec&, nb::handle) { return false; })
      .def("__hash__", [](const PartitionSpec& s) { return nb::hash(nb::str(s.to_json().c_str())); })
      .def("__repr__", &PartitionSpec::to_string);

  nb::class_<NamedSharding>(m, "NamedSharding", "An array's placement on a Mesh by a PartitionSpec.")
      .def(nb::init<Mesh, PartitionSpec>(), "mesh"_a, "spec"_a)
      .def_prop_ro("mesh", &NamedSharding::mesh)
      .def_prop_ro("spec", &NamedSharding::spec)
      .def(
          "devices_indices_map",
          [](const NamedSharding& s, nb::handle shape) {
            nb::dict out;
            for (const auto& [device, box] : s.devices_indices_map(to_shape(shape))) out[nb::int_(device)] = to_slices(box);
            return out;
          },
          "shape"_a, "{device id: tuple of slices}: each device's block, as JAX's devices_indices_map.")
      .def("shard_shape", [](const NamedSharding& s, nb::handle shape) { return from_shape(s.shard_shape(to_shape(shape))); },
           "shape"_a, "The block shape ceil(n / k) per dimension (every shard's shape when the shape divides).")
      .def(
          "replica_id",
          [](const NamedSharding& s, int64_t device, nb::handle shape) {
            return shape.is_none() ? s.replica_id(device) : s.replica_id(device, to_shape(shape));
          },
          "device"_a, "shape"_a = nb::none(),
          "0 for the first device (mesh order) holding its block, 1 for the next copy, ... With a "
          "shape, JAX's Shard.replica_id (which also counts devices holding equal empty blocks).")
      .def("num_blocks", &NamedSharding::num_blocks, "dim"_a)
      .def_prop_ro("is_fully_replicated", &NamedSharding::is_fully_replicated)
      .def("check_divisible", [](const NamedSharding& s, nb::handle shape) { s.check_divisible(to_shape(shape)); },
           "shape"_a, "Raises ArgumentError unless every sharded dimension divides (JAX's rule).")
      .def("__eq__", [](const NamedSharding& a, const NamedSharding& b) { return a == b; })
      .def("__eq__", [](const NamedSharding&, nb::handle) { return false; })
      .def("__repr__", &NamedSharding::to_string);

  nb::class_<LogicalRules>(m, "LogicalRules",
                           "An ordered list of (logical name, mesh axes) rules, resolved as Flax Linen's "
                           "logical_to_mesh_axes, with MaxText's options.")
      .def(
          "__init__",
          [](LogicalRules* self, nb::handle rules, std::vector<std::string> mesh_axes) {
            new (self) LogicalRules(to_rules(rules), std::move(mesh_axes));
          },
          "rules"_a, "mesh_axes"_a = std::vector<std::string>{},
          "LogicalRules([('embed', 'fsdp'), ('mlp', ('fsdp', 'tensor')), ('kv', None)])")
      .def_prop_ro("rules",
                   [](const LogicalRules& r) {
                     nb::list out;
                     for (const auto& rule : r.rules()) out.append(nb::make_tuple(rule.logical, from_dim(rule.mesh_axes)));
                     return out;
                   })
      .def_prop_ro("mesh_axes", &LogicalRules::mesh_axes)
      .def(
          "logical_to_mesh_axes",
          [](const LogicalRules& r, nb::handle names) { return r.logical_to_mesh_axes(to_logical(names)); }, "logical_axes"_a,
          "Flax's logical_to_mesh_axes: no mesh, no options.")
      .def(
          "resolve",
          [](const LogicalRules& r, nb::handle names, const Mesh& mesh, nb::handle shape, bool remove_size_one_axes,
             bool drop_indivisible, bool strict, const std::string& name) {
            return r.resolve(to_logical(names), mesh, options(remove_size_one_axes, drop_indivisible, strict),
                             optional_shape(shape), name);
          },
          "logical_axes"_a, "mesh"_a, nb::kw_only(), "shape"_a = nb::none(), "remove_size_one_axes"_a = false,
          "drop_indivisible"_a = false, "strict"_a = false, "name"_a = "",
          "The PartitionSpec of an array with these logical axes on `mesh`.")
      .def(
          "explain",
          [](const LogicalRules& r, nb::handle names, const Mesh& mesh, nb::handle shape, bool remove_size_one_axes,
             bool drop_indivisible, bool strict, const std::string& name) {
            const std::optional<Shape> s = optional_shape(shape);
            const Resolution res = r.explain(to_logical(names), mesh,
                                             options(remove_size_one_axes, drop_indivisible, strict), s, name);
            return r.describe(res, mesh, s);
          },
          "logical_axes"_a, "mesh"_a, nb::kw_only(), "shape"_a = nb::none(), "remove_size_one_axes"_a = false,
          "drop_indivisible"_a = false, "strict"_a = false, "name"_a = "",
          "Why each rule was applied or skipped, per dimension (text).")
      .def("__len__", [](const LogicalRules& r) { return r.rules().size(); })
      .def("__repr__", [](const LogicalRules& r) {
        return "LogicalRules(" + std::to_string(r.rules().size()) + " rules" +
               (r.source().empty() ? std::string() : " from " + r.source()) + ")";
      });

  m.def(
      "load_rules",
      [](const std::string& path_or_text) {
        // Text has a line break, a key (':') or a flow list/map; anything else names a file.
        const bool text = path_or_text.find_first_of("\n:") != std::string::npos ||
                          path_or_text.starts_with('[') || path_or_text.starts_with('{');
        return text ? parse_rules_yaml(path_or_text, "<text>") : load_rules(path_or_text);
      },
      "path_or_text"_a,
      "Rules from a MaxText YAML/JSON file (logical_axis_rules, mesh_axes) or from such text.");
}

}  // namespace tessel::python
