#include "tessel/models/maxtext_checkpoint.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/nn/optimizer.h"
#include "tessel/runtime/array.h"
#include "tessel/sharding/detail/spec_json.h"

namespace tessel {
namespace {

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  for (std::string_view part : text_util::split(path, '/')) out.emplace_back(part);
  return out;
}

std::string dict_key(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += "/['" + p + "']";
  return out;
}

constexpr const char* kParamsPrefix = "params/params/";

}  // namespace

std::vector<MaxTextStateEntry> maxtext_train_state(const MaxTextConfig& c, const State& state) {
  if (c.opt_type != "adamw")
    throw ValueError(fmt::format("opt_type '{}': tessel builds MaxText's TrainState for adamw only", c.opt_type));
  return maxtext_train_state(state, c.mu_dtype);
}

std::vector<MaxTextStateEntry> maxtext_train_state(const State& state, std::optional<DType> mu_dtype) {
  struct Leaf {
    std::vector<std::string> parts;
    const Variable* v;
    std::string path;
  };
  std::vector<Leaf> leaves;
  std::optional<Mesh> mesh;
  for (const auto& [path, v] : state) {
    if (v.kind() != kParam) continue;
    leaves.push_back({components(path), &v, path});
    if (v.sharding()) mesh = v.sharding()->mesh();
  }
  std::sort(leaves.begin(), leaves.end(), [](const Leaf& a, const Leaf& b) { return a.parts < b.parts; });
  std::vector<MaxTextStateEntry> out;
  auto counter = [&](std::string key, std::string orbax_path) {
    std::optional<NamedSharding> sharding;
    if (mesh) sharding = NamedSharding(*mesh, PartitionSpec{});
    out.push_back({std::move(key), std::move(orbax_path), "", Shape{}, DType::kI32, {}, sharding});
  };
  auto tree = [&](const std::string& key_prefix, const std::string& orbax_prefix, const std::string& tessel_prefix,
                  std::optional<DType> dtype) {
    for (const Leaf& l : leaves)
      out.push_back({key_prefix + "/['params']" + dict_key(l.parts), orbax_prefix + "/params/" + l.path,
                     tessel_prefix + l.path, l.v->shape(), dtype.value_or(l.v->dtype()), l.v->partitioning().logical,
                     l.v->sharding()});
  };
  counter(".step", "step");
  tree(".params", "params", "", std::nullopt);
  counter(".opt_state/[0]/.count", "opt_state/0/count");
  tree(".opt_state/[0]/.mu", "opt_state/0/mu", "opt_state/mu/", mu_dtype);
  tree(".opt_state/[0]/.nu", "opt_state/0/nu", "opt_state/nu/", std::nullopt);
  counter(".opt_state/[2]/.count", "opt_state/2/count");
  return out;
}

State to_maxtext_layout(const Runtime& rt, const State& train_state, int64_t step) {
  if (step < 0 || step > std::numeric_limits<int32_t>::max())
    throw ValueError(fmt::format("step {} does not fit MaxText's int32 step counter", step));
  State out;
  const int32_t value = static_cast<int32_t>(step);
  for (const MaxTextStateEntry& e : maxtext_train_state(train_state)) {
    if (e.tessel_path.empty()) {
      if (!e.sharding) throw ValueError("the train state has no sharding to place the step counters on");
      out.insert(e.orbax_path, Variable(nn::kOptState, device_put(rt, HostArray::from<int32_t>(Shape{}, {value}),
                                                                  *e.sharding, e.orbax_path)));
      continue;
    }
    if (!train_state.contains(e.tessel_path))
      throw ValueError(fmt::format("MaxText's layout holds AdamW's state: the train state has no '{}' (train with "
                                   "--optimizer adamw)", e.tessel_path));
    out.insert(e.orbax_path, train_state.at(e.tessel_path));
  }
  return out;
}

State maxtext_layout_target(const State& abstract) {
  State out;
  for (const MaxTextStateEntry& e : maxtext_train_state(abstract)) {
    if (e.tessel_path.empty()) {
      out.insert(e.orbax_path, Variable::abstract(nn::kOptState, Shape{}, DType::kI32, e.sharding));
    } else {
      if (!abstract.contains(e.tessel_path))
        throw ValueError(fmt::format("MaxText's layout holds AdamW's state: the train state has no '{}'", e.tessel_path));
      out.insert(e.orbax_path, abstract.at(e.tessel_path).to_abstract());
    }
  }
  return out;
}

State from_maxtext_layout(const State& restored, const State& abstract, int64_t* step) {
  State out;
  std::optional<int64_t> saved;
  for (const MaxTextStateEntry& e : maxtext_train_state(abstract)) {
    if (!restored.contains(e.orbax_path))
      throw ValueError(fmt::format("the checkpoint's TrainState has no '{}'", e.orbax_path));
    const Variable& v = restored.at(e.orbax_path);
    if (!e.tessel_path.empty()) {
      out.insert(e.tessel_path, v);
      continue;
    }
    const HostArray host = to_host(v.array(e.orbax_path));
    if (host.shape() != Shape{} || (host.dtype() != DType::kI32 && host.dtype() != DType::kI64))
      throw ValueError(fmt::format("the checkpoint's '{}' is {}, not an integer scalar", e.orbax_path,
                                   type_string(host.dtype(), host.shape())));
    const int64_t n = host.dtype() == DType::kI32 ? host.values<int32_t>()[0] : host.values<int64_t>()[0];
    if (e.orbax_path == "step") saved = n;
  }
  if (step) *step = saved.value_or(0);
  return out;
}

void write_maxtext_shardings(const std::vector<MaxTextStateEntry>& entries, const std::filesystem::path& dir) {
  json_util::Json logical = json_util::Json::object(), named = json_util::Json::object();
  for (const MaxTextStateEntry& e : entries) {
    json_util::Json shape = json_util::Json::array(), names = json_util::Json::array();
    for (int64_t d : e.shape.dims()) shape.push_back(d);
    for (const auto& n : e.logical) names.push_back(n ? json_util::Json(*n) : json_util::Json(nullptr));
    logical[e.key] = {{"partition_spec", names}, {"shape", shape}};
    if (!e.sharding) throw ValueError("'" + e.key + "' has no sharding (eval_shape on a mesh first)");
    const Mesh& mesh = e.sharding->mesh();
    json_util::Json axis_names = json_util::Json::array(), sizes = json_util::Json::object();
    for (const MeshAxis& a : mesh.axes()) {
      axis_names.push_back(a.name);
      sizes[a.name] = a.size;
    }
    named[e.key] = {{"mesh", {{"axis_names", axis_names}, {"shape", sizes}}},
                    {"partition_spec", spec_json::to_json(e.sharding->spec())},
                    {"shape", shape}};
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
  file_util::write_text(dir / "logical_shardings.json", json_util::dump(logical, 2) + "\n");
  file_util::write_text(dir / "named_shardings.json", json_util::dump(named, 2) + "\n");
}

ConvertOptions maxtext_params_conversion(const CheckpointItem& src, ConvertOptions options) {
  const State saved = src.abstract_state();
  bool maxtext = false;
  for (const auto& [path, v] : saved) maxtext = maxtext || path.starts_with(kParamsPrefix);
  // Each leaf goes where the renames put it, under params/params/ unless it is there already.
  TargetSpec& spec = options.target;
  std::vector<std::pair<std::string, std::string>> moves;
  for (const auto& [path, v] : saved) {
    const bool param = maxtext ? path.starts_with(kParamsPrefix)
                               : !path.starts_with("opt_state/") && path != "step" && v.kind() != nn::kOptState;
    if (!param) continue;
    if (!spec.paths.empty() && std::find(spec.paths.begin(), spec.paths.end(), path) == spec.paths.end()) continue;
    const std::string renamed = rename_path(path, spec.rename);
    moves.emplace_back(path, renamed.starts_with(kParamsPrefix) ? renamed : kParamsPrefix + renamed);
  }
  if (moves.empty()) throw ValueError(src.dir().string() + " holds no parameters to write");
  spec.paths.clear();
  for (const auto& [from, to] : moves) spec.paths.push_back(from);
  spec.rename = std::move(moves);  // a whole path renames exactly that leaf
  // MaxText's generate_param_only_checkpoint casts to bfloat16.
  if (!options.dtype) options.dtype = DType::kBF16;
  options.to = CheckpointFormat::kOrbax;
  options.orbax.empty_nodes.insert("opt_state");
  options.as_step = ConvertOptions::Step{0, kMaxTextItem};
  options.extra.push_back({"step", nn::kOptState, HostArray::from<int32_t>(Shape{}, {0})});
  return options;
}

}  // namespace tessel
