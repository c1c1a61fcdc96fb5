#include "tessel/state/plan.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace {

using text_util::format_bytes;

// Byte counts of absurd models (a fuzzer's, or a typo's) must fail cleanly, not wrap around.
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r))
    throw ValueError("plan: the byte counts exceed 2^63 (check the model's sizes)");
  return r;
}

int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw ValueError("plan: the byte counts exceed 2^63 (check the model's sizes)");
  return r;
}

// Elements per device (by mesh position) of one (shape, sharding), from its distinct blocks.
struct Layout {
  std::vector<int64_t> elements;
  int64_t max_block = 0;
  int64_t copies = 1;
  int64_t bytes_per_element = 0;  // summed over every parameter with this layout
};

BytesSummary summarize(const std::vector<int64_t>& per_device) {
  BytesSummary s;
  if (per_device.empty()) return s;
  auto lo = std::min_element(per_device.begin(), per_device.end());
  auto hi = std::max_element(per_device.begin(), per_device.end());  // the first fullest device
  s.max = *hi;
  s.min = *lo;
  s.max_device = hi - per_device.begin();
  double sum = 0;
  for (int64_t b : per_device) sum += static_cast<double>(b);
  s.mean = sum / static_cast<double>(per_device.size());
  return s;
}

BytesSummary scaled(const BytesSummary& s, int64_t k) {
  return {mul(s.max, k), mul(s.min, k), s.mean * static_cast<double>(k), s.max_device};
}

bool counts_gradients(const PlanOptions& o) { return o.gradients || o.optimizer != Optimizer::kNone; }

int64_t moments(Optimizer o) { return o == Optimizer::kAdamW ? 2 : o == Optimizer::kSgdMomentum ? 1 : 0; }

}  // namespace

std::string_view name(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kNone: return "none";
    case Optimizer::kSgdMomentum: return "sgd";
    case Optimizer::kAdamW: return "adamw";
  }
  return "?";
}

Optimizer parse_optimizer(std::string_view text) {
  if (text == "none") return Optimizer::kNone;
  if (text == "sgd" || text == "sgd_momentum" || text == "momentum") return Optimizer::kSgdMomentum;
  if (text == "adamw" || text == "adam") return Optimizer::kAdamW;
  throw ValueError(fmt::format("unknown optimizer '{}' (known: none, sgd, adamw)", text));
}

MemoryPlan plan(const State& state, const PlanOptions& options) {
  MemoryPlan p;
  p.options = options;
  if (!(options.tolerance >= 0 && options.tolerance <= 1))
    throw ValueError(fmt::format("plan: tolerance must be in [0, 1], got {}", options.tolerance));
  const Mesh* mesh = nullptr;
  std::unordered_map<std::string, Layout> layouts;

  for (const auto& [path, v] : state) {
    if (!v.sharding())
      throw ValueError(fmt::format("plan: variable '{}' has no sharding (plan an eval_shape result)", path));
    const NamedSharding& sharding = *v.sharding();
    if (!mesh) {
      mesh = &sharding.mesh();
      p.mesh = mesh->to_string();
      p.device_count = mesh->device_count();
      for (const MeshAxis& a : mesh->axes())
        if (a.size > 1 && std::find(options.replica_axes.begin(), options.replica_axes.end(), a.name) ==
                              options.replica_axes.end())
          p.weight_axes.push_back(a.name);
    } else if (!(sharding.mesh() == *mesh)) {
      throw ValueError(fmt::format("plan: variable '{}' is on {}, the others on {}; plan one mesh at a time", path,
                                   sharding.mesh().to_string(), p.mesh));
    }
    std::string key = v.shape().to_string() + sharding.spec().to_json();
    auto [it, fresh] = layouts.try_emplace(key);
    Layout& layout = it->second;
    if (fresh) {
      layout.elements.assign(static_cast<size_t>(mesh->device_count()), 0);
      std::vector<ShardPlacement> blocks = sharding.distinct_shards(v.shape());
      for (const ShardPlacement& b : blocks) {
        const int64_t n = b.box.volume();
        layout.max_block = std::max(layout.max_block, n);
        for (int64_t d : b.devices) layout.elements[static_cast<size_t>(mesh->position(d))] = n;
      }
      layout.copies = blocks.empty() ? 1 : static_cast<int64_t>(blocks.front().devices.size());
    }
    const auto item = static_cast<int64_t>(item_size(v.dtype()));
    layout.bytes_per_element = add(layout.bytes_per_element, item);

    ParamPlan pp{.path = path, .kind = v.kind(), .shape = v.shape(), .dtype = v.dtype(),
                 .spec = sharding.spec(), .bytes = v.nbytes(), .max_device_bytes = mul(layout.max_block, item),
                 .copies = layout.copies, .unsharded_axes = {}};
    std::vector<std::string> used = sharding.spec().used_axes();
    for (const std::string& a : p.weight_axes)
      if (std::find(used.begin(), used.end(), a) == used.end()) pp.unsharded_axes.push_back(a);
    p.param_count = add(p.param_count, v.size());
    p.param_bytes = add(p.param_bytes, pp.bytes);
    p.params.push_back(std::move(pp));
  }

  // Bytes per device: each layout's element counts times the bytes per element of its users.
  std::vector<int64_t> per_device(static_cast<size_t>(p.device_count), 0);
  for (const auto& [key, layout] : layouts)
    for (size_t d = 0; d < per_device.size(); ++d)
      per_device[d] = add(per_device[d], mul(layout.elements[d], layout.bytes_per_element));
  p.params_per_device = summarize(per_device);
  if (mesh) p.params_per_device.max_device = mesh->device_ids()[static_cast<size_t>(p.params_per_device.max_device)];
  p.params_by_device = per_device;
  const bool gradients = counts_gradients(options);
  p.gradients_per_device = scaled(p.params_per_device, gradients ? 1 : 0);
  p.optimizer_per_device = scaled(p.params_per_device, moments(options.optimizer));
  p.total = scaled(p.params_per_device, 1 + (gradients ? 1 : 0) + moments(options.optimizer));

  auto by_bytes = [&](size_t a, size_t b) {
    return p.params[a].bytes != p.params[b].bytes ? p.params[a].bytes > p.params[b].bytes : a < b;
  };
  for (size_t i = 0; i < p.params.size(); ++i) {
    if (p.params[i].copies == p.device_count && p.device_count > 1) p.largest_replicated.push_back(i);
    if (!p.params[i].unsharded_axes.empty()) {
      p.offenders.push_back(i);
      p.unsharded_bytes = add(p.unsharded_bytes, p.params[i].bytes);
    }
  }
  std::sort(p.largest_replicated.begin(), p.largest_replicated.end(), by_bytes);
  std::sort(p.offenders.begin(), p.offenders.end(), by_bytes);
  if (p.largest_replicated.size() > options.top) p.largest_replicated.resize(options.top);
  p.unsharded_fraction = p.param_bytes > 0 ? static_cast<double>(p.unsharded_bytes) / static_cast<double>(p.param_bytes) : 0;
  p.sufficiently_sharded = p.weight_axes.empty() || p.unsharded_fraction <= options.tolerance;
  return p;
}

std::string MemoryPlan::to_string() const {
  std::string out = fmt::format("memory plan on {} ({} devices): {} parameters in {} arrays, {}\n", mesh,
                                device_count, text_util::group_digits(param_count), params.size(),
                                format_bytes(param_bytes));
  const bool gradients = counts_gradients(options);
  out += fmt::format("\n{:<12} {:>14} {:>14} {:>14}\n", "per device", "max", "min", "mean");
  auto row = [&](std::string_view label, const BytesSummary& s) {
    out += fmt::format("{:<12} {:>14} {:>14} {:>14}\n", label, format_bytes(s.max), format_bytes(s.min),
                       format_bytes(static_cast<int64_t>(s.mean + 0.5)));
  };
  row("params", params_per_device);
  if (gradients) row("gradients", gradients_per_device);
  if (options.optimizer != Optimizer::kNone)
    row(fmt::format("opt ({})", name(options.optimizer)), optimizer_per_device);
  if (gradients) row("total", total);
  out += fmt::format("(fullest device: {})\n", total.max_device);

  out += "\nlargest replicated parameters (every device holds them whole):\n";
  if (largest_replicated.empty()) out += "  none\n";
  for (size_t i : largest_replicated)
    out += fmt::format("  {:<56} {:<20} {:>12}\n", params[i].path, type_string(params[i].dtype, params[i].shape),
                       format_bytes(params[i].bytes));

  if (weight_axes.empty()) {
    out += "\nsufficiently sharded: no mesh axis of size > 1 besides the replica axes; nothing to check\n";
    return out;
  }
  out += fmt::format("\nsufficiently sharded: {} ({:.2f}% of parameter bytes are not sharded on every one of {}; "
                     "tolerance {:.2f}%)\n", sufficiently_sharded ? "yes" : "NO", 100 * unsharded_fraction,
                     fmt::join(weight_axes, ", "), 100 * options.tolerance);
  const size_t shown = std::min(offenders.size(), options.top);
  for (size_t k = 0; k < shown; ++k) {
    const ParamPlan& q = params[offenders[k]];
    out += fmt::format("  {:<56} {:>12}  {}  not on {}\n", q.path, format_bytes(q.bytes), q.spec.to_string(),
                       fmt::join(q.unsharded_axes, ", "));
  }
  if (offenders.size() > shown) out += fmt::format("  ... and {} more\n", offenders.size() - shown);
  return out;
}

std::string MemoryPlan::to_json() const {
  using nlohmann::ordered_json;
  auto summary = [](const BytesSummary& s) {
    return ordered_json{{"max", s.max}, {"min", s.min}, {"mean", s.mean}, {"max_device", s.max_device}};
  };
  ordered_json j;
  j["mesh"] = mesh;
  j["device_count"] = device_count;
  j["optimizer"] = std::string(name(options.optimizer));
  j["gradients"] = counts_gradients(options);
  j["param_count"] = param_count;
  j["param_bytes"] = param_bytes;
  j["per_device"] = {{"params", summary(params_per_device)}, {"gradients", summary(gradients_per_device)},
                     {"optimizer", summary(optimizer_per_device)}, {"total", summary(total)}};
  ordered_json replicated = ordered_json::array();
  for (size_t i : largest_replicated) replicated.push_back(params[i].path);
  j["largest_replicated"] = replicated;
  ordered_json offenders_json = ordered_json::array();
  for (size_t i : offenders)
    offenders_json.push_back({{"path", params[i].path}, {"bytes", params[i].bytes},
                              {"unsharded_axes", params[i].unsharded_axes}});
  j["sufficiently_sharded"] = {{"ok", sufficiently_sharded}, {"weight_axes", weight_axes},
                               {"replica_axes", options.replica_axes}, {"tolerance", options.tolerance},
                               {"unsharded_bytes", unsharded_bytes}, {"unsharded_fraction", unsharded_fraction},
                               {"offenders", offenders_json}};
  ordered_json list = ordered_json::array();
  for (const ParamPlan& q : params)
    list.push_back({{"path", q.path}, {"kind", q.kind}, {"shape", q.shape.dims()},
                    {"dtype", std::string(name(q.dtype))}, {"spec", ordered_json::parse(q.spec.to_json())},
                    {"bytes", q.bytes}, {"max_device_bytes", q.max_device_bytes}, {"copies", q.copies}});
  j["params"] = list;
  return j.dump(2) + "\n";
}

}  // namespace tessel
