#include "tessel/models/maxtext_checkpoint.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/core/error.h"
#include "tessel/detail/file_util.h"
#include "tessel/detail/json_util.h"
#include "tessel/detail/text_util.h"
#include "tessel/models/detail/maxtext_families.h"
#include "tessel/nn/optimizer.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/reshard.h"
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
constexpr const char* kAuxPrefix = "nnx_aux/model/";


// MaxText 0.2.5's nnx_aux: the state of every nnx.Rngs the model holds (streams aqt, dropout and
// params; a uint32 count and an unsafe_rbg key of 4 words, stacked over a scanned stack's units),
// unsharded; its MoEBiasVar routing biases (DeepSeek V3's score correction) move there from the
// parameters, stacked first, without optimizer moments.
void append_nnx_aux(const MaxTextConfig& c, const std::optional<Mesh>& mesh, std::vector<MaxTextStateEntry>& out) {
  const std::optional<NamedSharding> replicated =
      mesh ? std::optional(NamedSharding(*mesh, PartitionSpec{})) : std::nullopt;
  auto add = [&](const std::vector<std::string>& parts, Shape shape, DType dtype) {
    std::string path = "nnx_aux/model";
    for (const std::string& p : parts) path += "/" + p;
    LogicalAxes logical(shape.rank());  // unsharded
    out.push_back({".nnx_aux/['model']" + dict_key(parts), path, "", std::move(shape), dtype, std::move(logical),
                   replicated});
  };
  auto rngs = [&](std::vector<std::string> at, std::optional<int64_t> stacked) {
    for (const char* stream : {"aqt", "dropout", "params"}) {
      std::vector<std::string> parts = at;
      parts.insert(parts.end(), {"rngs", stream, "count"});
      add(parts, stacked ? Shape{*stacked} : Shape{}, DType::kU32);
      parts.back() = "key";
      add(parts, stacked ? Shape{*stacked, 4} : Shape{4}, DType::kU32);
    }
  };
  const maxtext::Family& family = maxtext::family_of(c);
  const bool aux_bias = maxtext_aux_routing_bias(c);
  for (const maxtext::Stack& s : family.stacks(c)) {
    const int64_t units = s.count / family.layers_per_unit(c);
    for (int64_t u = 0; u < (c.scan_layers ? 1 : units); ++u) {
      const std::string unit = c.scan_layers ? s.name : s.name + "_" + std::to_string(u);
      const std::optional<int64_t> stacked = c.scan_layers ? std::optional(units) : std::nullopt;
      for (const std::string& holder : family.rng_holders(s.moe)) {
        std::vector<std::string> at{"decoder", unit};
        for (std::string_view part : text_util::split(holder, '/'))
          if (!part.empty()) at.emplace_back(part);
        rngs(at, stacked);
      }
      if (aux_bias && s.moe) {
        add({"decoder", unit, "DeepSeekMoeBlock_0", "MoeBlock_0", "gate", "bias"},
            stacked ? Shape{*stacked, c.num_experts} : Shape{c.num_experts}, c.weight_dtype);
      }
    }
  }
  rngs({"decoder"}, std::nullopt);
}

}  // namespace

std::vector<MaxTextStateEntry> maxtext_train_state(const MaxTextConfig& c, const State& state, bool nnx_aux) {
  if (c.opt_type != "adamw")
    throw ValueError(fmt::format("opt_type '{}': tessel builds MaxText's TrainState for adamw only", c.opt_type));
  std::vector<MaxTextStateEntry> out = maxtext_train_state(state, c.mu_dtype);
  if (!nnx_aux) return out;
  std::optional<Mesh> mesh;
  for (const auto& [path, v] : state)
    if (v.sharding()) mesh = v.sharding()->mesh();
  if (maxtext_aux_routing_bias(c)) {
    // The routing bias is no parameter there: no params/params entry, no mu, no nu.
    std::erase_if(out, [](const MaxTextStateEntry& e) { return e.orbax_path.ends_with("/MoeBlock_0/gate/bias"); });
  }
  append_nnx_aux(c, mesh, out);
  return out;
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

bool maxtext_aux_routing_bias(const MaxTextConfig& c) {
  return c.routed_bias && c.family == MaxTextFamily::kDeepseek && c.moe_bias_is_aux();
}

std::string maxtext_aux_bias_path(const std::string& path) {
  const bool bias = path.ends_with("/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias") && path.starts_with("decoder/");
  return bias ? kAuxPrefix + path : std::string();
}

namespace {

// A routing bias of a scanned stack is [experts, layers] in tessel's state, [layers, experts] in
// nnx_aux; an unscanned layer's is [experts] either way.
Array flipped(const Array& a) {
  if (a.shape().rank() != 2) return a;
  return ops::transpose(Tensor(a), {1, 0}).array();
}

NamedSharding flipped(const NamedSharding& s, size_t rank) {
  if (rank != 2) return s;
  const PartitionSpec& spec = s.spec();
  const DimSharding first = spec.size() > 0 ? spec[0] : DimSharding{};
  const DimSharding second = spec.size() > 1 ? spec[1] : DimSharding{};
  return NamedSharding(s.mesh(), PartitionSpec({second, first}));
}

Shape flipped(const Shape& shape) { return shape.rank() == 2 ? Shape{shape[1], shape[0]} : shape; }

// AdamW's moments of the routing bias: entries the layouts handle apart when it is under nnx_aux.
bool is_bias_moment(const MaxTextStateEntry& e) {
  return (e.tessel_path.starts_with("opt_state/mu/") || e.tessel_path.starts_with("opt_state/nu/")) &&
         !maxtext_aux_bias_path(e.tessel_path.substr(13)).empty();
}

}  // namespace

State to_maxtext_layout(const Runtime& rt, const State& train_state, int64_t step, bool aux_routing_bias) {
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
    if (aux_routing_bias && is_bias_moment(e)) continue;
    if (const std::string aux = aux_routing_bias ? maxtext_aux_bias_path(e.tessel_path) : ""; !aux.empty()) {
      const Variable& v = train_state.at(e.tessel_path);
      out.insert(aux, Variable(v.kind(), flipped(v.array(e.tessel_path))));
      continue;
    }
    out.insert(e.orbax_path, train_state.at(e.tessel_path));
  }
  return out;
}

State maxtext_layout_target(const State& abstract, bool aux_routing_bias) {
  State out;
  for (const MaxTextStateEntry& e : maxtext_train_state(abstract)) {
    if (e.tessel_path.empty()) {
      out.insert(e.orbax_path, Variable::abstract(nn::kOptState, Shape{}, DType::kI32, e.sharding));
      continue;
    }
    if (!abstract.contains(e.tessel_path))
      throw ValueError(fmt::format("MaxText's layout holds AdamW's state: the train state has no '{}'", e.tessel_path));
    if (aux_routing_bias && is_bias_moment(e)) continue;
    const Variable& v = abstract.at(e.tessel_path);
    if (const std::string aux = aux_routing_bias ? maxtext_aux_bias_path(e.tessel_path) : ""; !aux.empty()) {
      std::optional<NamedSharding> s;
      if (v.sharding()) s = flipped(*v.sharding(), v.shape().rank());
      out.insert(aux, Variable::abstract(v.kind(), flipped(v.shape()), v.dtype(), s));
      continue;
    }
    out.insert(e.orbax_path, v.to_abstract());
  }
  return out;
}

State from_maxtext_layout(const State& restored, const State& abstract, int64_t* step, bool aux_routing_bias) {
  State out;
  std::optional<int64_t> saved;
  for (const MaxTextStateEntry& e : maxtext_train_state(abstract)) {
    if (aux_routing_bias && !e.tessel_path.empty()) {
      const Variable& want = abstract.at(e.tessel_path);
      if (is_bias_moment(e)) {  // MaxText does not train the bias: its moments start at zero
        const Array any = restored.begin()->second.array();
        out.insert(e.tessel_path,
                   Variable(want.kind(),
                            make_array_from_callback(any.runtime(), want.shape(), want.dtype(), *want.sharding(),
                                                     [](const Box&, std::span<std::byte> b) {
                                                       std::fill(b.begin(), b.end(), std::byte{0});
                                                     }),
                            want.partitioning()));
        continue;
      }
      if (const std::string aux = maxtext_aux_bias_path(e.tessel_path); !aux.empty()) {
        if (!restored.contains(aux)) throw ValueError(fmt::format("the checkpoint's TrainState has no '{}'", aux));
        const Array back = reshard(flipped(restored.at(aux).array(aux)), *want.sharding());
        out.insert(e.tessel_path, Variable(want.kind(), back, want.partitioning()));
        continue;
      }
    }
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

namespace {

// Through a key map, its targets (MaxText's parameters, named as in the model) go under
// params/params/ after the renames asked for.
std::vector<std::pair<std::string, std::string>> mapped_params_moves(const CheckpointItem& src,
                                                                     const ConvertOptions& options) {
  const MapPlan plan = plan_key_map(*options.map, select_leaves(src.abstract_state(), options.target.select));
  if (!plan.forward)
    throw ValueError(src.dir().string() + " matches the key map's target side: MaxText's parameter-only checkpoint "
                     "is written from the map's source side (a Hugging Face checkpoint through a map to MaxText's names)");
  std::vector<std::pair<std::string, std::string>> moves;
  for (const MappedTensor& t : plan.tensors) {
    const std::string renamed = rename_path(t.path, options.target.rename);
    moves.emplace_back(t.path, renamed.starts_with(kParamsPrefix) ? renamed : kParamsPrefix + renamed);
  }
  return moves;
}

// A MaxText TrainState's params/params/ subtree, or a tessel train state's parameters put there.
TargetSpec params_only_target(const CheckpointItem& src, TargetSpec spec) {
  const State saved = src.abstract_state();
  bool maxtext = false;
  for (const auto& [path, v] : saved) maxtext = maxtext || path.starts_with(kParamsPrefix);
  // Each leaf goes where the renames put it, under params/params/ unless it is there already.
  std::vector<std::pair<std::string, std::string>> moves;
  for (const auto& [path, v] : saved) {
    // MaxText 0.2.5 keeps DeepSeek V3's routing bias under nnx_aux in a TrainState, and reads a
    // parameter-only checkpoint's from params/params/ (its legacy-collection alias), same shape.
    const std::string aux_bias = path.starts_with(kAuxPrefix) ? path.substr(std::string_view(kAuxPrefix).size()) : "";
    const bool routing_bias = maxtext && !aux_bias.empty() && !maxtext_aux_bias_path(aux_bias).empty();
    const bool param = maxtext ? path.starts_with(kParamsPrefix) || routing_bias
                               : !path.starts_with("opt_state/") && path != "step" && v.kind() != nn::kOptState;
    if (!param) continue;
    if (!spec.paths.empty() && std::find(spec.paths.begin(), spec.paths.end(), path) == spec.paths.end()) continue;
    const std::string renamed = rename_path(routing_bias ? kParamsPrefix + aux_bias : path, spec.rename);
    moves.emplace_back(path, renamed.starts_with(kParamsPrefix) ? renamed : kParamsPrefix + renamed);
  }
  if (moves.empty()) throw ValueError(src.dir().string() + " holds no parameters to write");
  spec.paths.clear();
  for (const auto& [from, to] : moves) spec.paths.push_back(from);
  spec.rename = std::move(moves);  // a whole path renames exactly that leaf
  return spec;
}

}  // namespace

ConvertOptions maxtext_params_conversion(const CheckpointItem& src, ConvertOptions options) {
  if (options.map) {
    options.target.rename = mapped_params_moves(src, options);
  } else {
    options.target = params_only_target(src, std::move(options.target));
  }
  // MaxText's generate_param_only_checkpoint casts to bfloat16, as its to_maxtext does by default.
  if (!options.dtype) options.dtype = DType::kBF16;
  options.to = CheckpointFormat::kOrbax;
  options.orbax.empty_nodes.insert("opt_state");
  options.as_step = ConvertOptions::Step{0, kMaxTextItem};
  options.extra.push_back({"step", nn::kOptState, HostArray::from<int32_t>(Shape{}, {0})});
  return options;
}

State params_from_checkpoint(const Runtime& rt, const CheckpointItem& item, const State& params, std::string* where) {
  const State saved = item.abstract_state();
  struct Layout {
    std::string prefix, suffix;
  };
  struct Source {
    std::string path;   // empty: not saved, starts at zero
    bool flip = false;  // saved [layers, experts], tessel's [experts, layers]
  };
  auto source = [&](const Layout& l, const std::string& p) -> std::optional<Source> {
    const std::string path = l.prefix + p + l.suffix;
    const bool stacked_bias = !maxtext_aux_bias_path(p).empty() && params.at(p).shape().rank() == 2;
    if (stacked_bias && l.prefix == kParamsPrefix) {
      if (saved.contains(kAuxPrefix + p)) return Source{kAuxPrefix + p, true};
      // With AdamW moments it was trained as a parameter, in tessel's (and older MaxText's) order.
      if (saved.contains(path)) return Source{path, !saved.contains("opt_state/0/mu/" + path)};
    }
    if (saved.contains(path)) return Source{path, false};
    // MaxText 0.2.5's parameter-only checkpoint holds nnx.Params alone, not DeepSeek V3's routing
    // bias (a MoEBiasVar): it starts at zero, as MaxText's own load of that checkpoint starts it.
    if (!maxtext_aux_bias_path(p).empty()) return Source{};
    return std::nullopt;
  };
  auto first_missing = [&](const Layout& l) -> std::optional<std::string> {
    for (const auto& [p, v] : params)
      if (!source(l, p)) return l.prefix + p + l.suffix;
    return std::nullopt;
  };
  const std::vector<Layout> layouts = {{"", ""}, {kParamsPrefix, ""}, {"params/", ""}, {"", "/value"}};
  const auto layout = std::find_if(layouts.begin(), layouts.end(), [&](const Layout& l) { return !first_missing(l); });
  if (layout == layouts.end())
    throw ValueError(fmt::format("{}: the checkpoint does not hold this model's parameters at its top, under "
                                 "params/params/ or params/, or as MaxText 0.2.5's parameter-only checkpoint "
                                 "(<path>/value) (it lacks '{}')",
                                 item.dir().string(), *first_missing(layouts.front())));
  State target;
  std::vector<std::pair<std::string, Source>> sources;
  for (const auto& [p, v] : params) {
    const Source s = *source(*layout, p);
    sources.emplace_back(p, s);
    if (s.path.empty()) continue;
    if (!s.flip) {
      target.insert(s.path, v);
      continue;
    }
    std::optional<NamedSharding> sharding;
    if (v.sharding()) sharding = flipped(*v.sharding(), v.shape().rank());
    target.insert(s.path, Variable::abstract(v.kind(), flipped(v.shape()), v.dtype(), sharding));
  }
  RestoreOptions options;
  options.partial = true;
  const State restored = restore(rt, item, target, options);
  State placed;
  int64_t zeroed = 0;
  for (const auto& [p, s] : sources) {
    const Variable& want = params.at(p);
    if (s.path.empty()) {
      if (!want.sharding()) throw ValueError(fmt::format("'{}' has no sharding to place it by", p));
      placed.insert(p, Variable(want.kind(),
                                make_array_from_callback(rt, want.shape(), want.dtype(), *want.sharding(),
                                                         [](const Box&, std::span<std::byte> out) {
                                                           std::fill(out.begin(), out.end(), std::byte{0});
                                                         }),
                                want.partitioning()));
      ++zeroed;
      continue;
    }
    const Variable& got = restored.at(s.path);
    if (!s.flip) {
      placed.insert(p, got);
      continue;
    }
    const Array back = want.sharding() ? reshard(flipped(got.array(s.path)), *want.sharding()) : flipped(got.array(s.path));
    placed.insert(p, Variable(want.kind(), back, want.partitioning()));
  }
  if (where)
    *where = !layout->suffix.empty()  ? " (MaxText 0.2.5's parameter-only layout)"
             : layout->prefix.empty() ? ""
                                      : " (under " + layout->prefix.substr(0, layout->prefix.size() - 1) + ")";
  if (where && zeroed)
    *where += fmt::format("; {} routing bias{} not in it start{} at zero", zeroed, zeroed == 1 ? "" : "es",
                          zeroed == 1 ? "s" : "");
  return placed;
}

}  // namespace tessel
