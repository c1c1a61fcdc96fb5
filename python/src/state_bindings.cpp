// Model configs, eval_shape, memory plans and the forward pass for Python. eval_shape crosses the
// boundary flat, as (path, ...) records that tessel/_model.py turns into a tree; plans are bound as
// read-only value types; neither allocates a parameter (the mesh may be far larger than this
// machine). forward takes whole weights and inputs as bytes and runs on host devices.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "convert.h"
#include "tessel/core/error.h"
#include "tessel/state/init.h"
#include "tessel/models/forward.h"
#include "tessel/models/model_config.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/plan.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessel::python {
namespace {

// (path, kind, shape, dtype name, NamedSharding, logical axes / mesh spec / None) per variable.
nb::list eval_shape_records(const ModelConfig& config, const Mesh& mesh, const LogicalRules& rules,
                            bool remove_size_one_axes, bool drop_indivisible, bool strict) {
  const State state = eval_shape(config.build(), mesh, rules, {remove_size_one_axes, drop_indivisible, strict});
  nb::list out;
  for (const auto& [path, v] : state)
    out.append(nb::make_tuple(path, v.kind(), from_shape(v.shape()), std::string(name(v.dtype())), *v.sharding(),
                              from_partitioning(v.partitioning())));
  return out;
}

MemoryPlan plan_of(const ModelConfig& config, const Mesh& mesh, const LogicalRules& rules,
                   bool remove_size_one_axes, bool drop_indivisible, bool strict, const std::string& optimizer,
                   bool gradients, std::vector<std::string> replica_axes, double tolerance, size_t top) {
  if (!(tolerance >= 0 && tolerance <= 1))
    throw ValueError("plan: tolerance must be between 0 and 1, not " + std::to_string(tolerance));
  PlanOptions options;
  options.optimizer = parse_optimizer(optimizer);
  options.gradients = gradients;
  options.replica_axes = std::move(replica_axes);
  options.tolerance = tolerance;
  options.top = top;
  return plan(eval_shape(config.build(), mesh, rules, {remove_size_one_axes, drop_indivisible, strict}), options);
}

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

HostArray host_array(const std::string& dtype, nb::handle shape, nb::handle bytes, const std::string& what) {
  const Bytes b = nb::cast<Bytes>(bytes);
  const auto* p = reinterpret_cast<const std::byte*>(b.data());
  return HostArray(to_shape(shape, what + " shape"), parse_dtype(dtype), std::vector<std::byte>(p, p + b.size()));
}

// weights: (path, dtype name, shape, C-order bytes) per parameter; inputs likewise without a path.
// Returns (dtype name, shape, bytes) of the output.
nb::tuple forward_records(const ModelConfig& model, const Mesh& mesh, const LogicalRules& rules, nb::list weights,
                          const std::string& dtype, nb::handle shape, nb::handle bytes) {
  std::map<std::string, HostArray> w;
  for (nb::handle h : weights) {
    nb::tuple t = nb::borrow<nb::tuple>(h);
    const std::string path = nb::cast<std::string>(t[0]);
    w.emplace(path, host_array(nb::cast<std::string>(t[1]), t[2], t[3], path));
  }
  const HostArray inputs = host_array(dtype, shape, bytes, "inputs");
  std::optional<HostArray> out;
  {
    nb::gil_scoped_release release;
    int64_t devices = 1;
    for (int64_t d : mesh.device_ids()) devices = std::max(devices, d + 1);
    const Runtime rt = Runtime::host(devices);
    out = forward_on_host(rt, model, mesh, rules, w, inputs);
  }
  const auto raw = out->bytes();
  return nb::make_tuple(std::string(name(out->dtype())), from_shape(out->shape()),
                        nb::bytes(reinterpret_cast<const char*>(raw.data()), raw.size()));
}

nb::dict summary_dict(const BytesSummary& s) {
  nb::dict d;
  d["max"] = s.max;
  d["min"] = s.min;
  d["mean"] = s.mean;
  d["max_device"] = s.max_device;
  return d;
}

}  // namespace

void bind_state(nb::module_& m) {
  nb::class_<ModelConfig>(m, "ModelConfig",
                          "A model description: tessel's YAML (model: transformer | dot_relu_dot, sizes), built "
                          "with tessel.load_model, or one of MaxText's, built with tessel.load_maxtext_model.")
      .def_prop_ro("family", &ModelConfig::family, "\"transformer\", \"dot_relu_dot\" or \"maxtext:<decoder_block>\"")
      .def_prop_ro(
          "rules",
          [](const ModelConfig& c) -> std::optional<LogicalRules> {
            if (const auto* m = std::get_if<MaxTextConfig>(&c.config)) return m->rules;
            return std::nullopt;
          },
          "A MaxText model's logical axis rules (base.yml's, merged with the model file's); None otherwise")
      .def(
          "maxtext_mesh",
          [](const ModelConfig& c, int64_t devices) {
            const auto* m = std::get_if<MaxTextConfig>(&c.config);
            if (!m) throw ValueError("maxtext_mesh: " + c.family() + " is not a MaxText model");
            Mesh mesh = m->mesh(devices);
            m->check_mesh(mesh);
            return mesh;
          },
          "devices"_a, "The mesh MaxText builds for this many devices from the config's ici_*/dcn_* parallelism")
      .def_ro("source", &ModelConfig::source, "The file (or \"<text>\") it was read from")
      .def("__repr__", [](const ModelConfig& c) { return "ModelConfig(" + c.family() + ", " + c.source + ")"; });
  m.def("load_model_file", [](const std::string& path) { return load_model_config(path); }, "path"_a);
  m.def("parse_model", [](const std::string& text) { return parse_model_config(text, "<text>"); }, "text"_a);
  m.def(
      "load_maxtext_model",
      [](const std::string& model, const std::string& base, std::vector<std::string> sets,
         std::optional<std::string> rules) {
        MaxTextSources sources{.model = model, .base = base, .overrides = std::move(sets), .rules = std::nullopt};
        if (rules) sources.rules = *rules;
        return load_maxtext_model(sources);
      },
      "model"_a, "base"_a, "sets"_a, "rules"_a.none());

  m.def("forward", &forward_records, "model"_a, "mesh"_a, "rules"_a, "weights"_a, "dtype"_a, "shape"_a, "bytes"_a);
  m.def("eval_shape_records", &eval_shape_records, "model"_a, "mesh"_a, "rules"_a, "remove_size_one_axes"_a,
        "drop_indivisible"_a, "strict"_a);

  nb::class_<ParamPlan>(m, "ParamPlan", "One parameter of a MemoryPlan.")
      .def_ro("path", &ParamPlan::path)
      .def_ro("kind", &ParamPlan::kind)
      .def_prop_ro("shape", [](const ParamPlan& p) { return from_shape(p.shape); })
      .def_prop_ro("dtype", [](const ParamPlan& p) { return std::string(name(p.dtype)); })
      .def_ro("spec", &ParamPlan::spec)
      .def_ro("bytes", &ParamPlan::bytes, "The whole parameter")
      .def_ro("max_device_bytes", &ParamPlan::max_device_bytes, "Its largest block")
      .def_ro("copies", &ParamPlan::copies, "Devices per distinct block")
      .def_ro("unsharded_axes", &ParamPlan::unsharded_axes, "Weight axes it is not sharded on")
      .def("__repr__", [](const ParamPlan& p) {
        return "ParamPlan(" + p.path + ", " + std::string(name(p.dtype)) + p.shape.to_string() + ", " +
               p.spec.to_string() + ")";
      });

  nb::class_<MemoryPlan>(m, "MemoryPlan",
                         "Bytes per device for parameters, gradients and optimizer state, the largest "
                         "replicated parameters and MaxText's sufficiently-sharded check; str() is the "
                         "table `tessel plan` prints.")
      .def_ro("mesh", &MemoryPlan::mesh)
      .def_ro("device_count", &MemoryPlan::device_count)
      .def_prop_ro("optimizer", [](const MemoryPlan& p) { return std::string(name(p.options.optimizer)); })
      .def_ro("param_count", &MemoryPlan::param_count, "Parameter elements")
      .def_ro("param_bytes", &MemoryPlan::param_bytes, "Parameter bytes, global")
      .def_ro("params", &MemoryPlan::params, "Every parameter, in State order")
      .def_ro("params_by_device", &MemoryPlan::params_by_device, "Parameter bytes per device, in mesh order")
      .def_prop_ro("params_per_device", [](const MemoryPlan& p) { return summary_dict(p.params_per_device); })
      .def_prop_ro("gradients_per_device", [](const MemoryPlan& p) { return summary_dict(p.gradients_per_device); })
      .def_prop_ro("optimizer_per_device", [](const MemoryPlan& p) { return summary_dict(p.optimizer_per_device); })
      .def_prop_ro("total_per_device", [](const MemoryPlan& p) { return summary_dict(p.total); },
                   "{max, min, mean, max_device}: parameters + gradients + optimizer state")
      .def_prop_ro("largest_replicated",
                   [](const MemoryPlan& p) {
                     std::vector<std::string> out;
                     for (size_t i : p.largest_replicated) out.push_back(p.params[i].path);
                     return out;
                   },
                   "Paths of the largest parameters every device holds whole")
      .def_ro("weight_axes", &MemoryPlan::weight_axes)
      .def_ro("unsharded_bytes", &MemoryPlan::unsharded_bytes)
      .def_ro("unsharded_fraction", &MemoryPlan::unsharded_fraction)
      .def_ro("sufficiently_sharded", &MemoryPlan::sufficiently_sharded)
      .def_prop_ro("offenders",
                   [](const MemoryPlan& p) {
                     std::vector<std::string> out;
                     for (size_t i : p.offenders) out.push_back(p.params[i].path);
                     return out;
                   },
                   "Paths of the parameters not sharded on every weight axis, largest first")
      .def("to_json", &MemoryPlan::to_json, "What `tessel plan --json` prints")
      .def("__str__", &MemoryPlan::to_string)
      .def("__repr__", [](const MemoryPlan& p) {
        return "MemoryPlan(" + p.mesh + ", " + std::to_string(p.params.size()) + " parameters, max " +
               std::to_string(p.total.max) + " bytes per device)";
      });

  m.def("plan", &plan_of, "model"_a, "mesh"_a, "rules"_a, "remove_size_one_axes"_a, "drop_indivisible"_a,
        "strict"_a, "optimizer"_a, "gradients"_a, "replica_axes"_a, "tolerance"_a, "top"_a);
}

}  // namespace tessel::python
