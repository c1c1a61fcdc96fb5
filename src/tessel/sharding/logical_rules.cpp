#include "tessel/sharding/logical_rules.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace {

std::string axes_text(const std::vector<std::string>& axes) {
  if (axes.empty()) return "None";
  if (axes.size() == 1) return axes[0];
  return fmt::format("({})", fmt::join(axes, ", "));
}

std::string dim_name(const LogicalAxes& names, size_t d) {
  return names[d] ? fmt::format("dimension {} ('{}')", d, *names[d])
                  : fmt::format("dimension {}", d);
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

bool holds(const std::vector<std::string>& axes, const std::string& axis) {
  return std::find(axes.begin(), axes.end(), axis) != axes.end();
}

}  // namespace

struct LogicalRules::Flax {
  std::vector<std::optional<size_t>> applied;            // per dimension: the rule Flax applied
  std::vector<std::pair<size_t, RuleTrial>> blocked;     // (dimension, trial) skipped for an axis
};

LogicalRules::LogicalRules(std::vector<LogicalRule> rules, std::vector<std::string> mesh_axes,
                           std::string source)
    : rules_(std::move(rules)), mesh_axes_(std::move(mesh_axes)), source_(std::move(source)) {
  for (size_t r = 0; r < rules_.size(); ++r) {
    const LogicalRule& rule = rules_[r];
    if (rule.logical.empty())
      throw ValueError(fmt::format("{} has an empty logical name", rule_label(r)));
    for (size_t i = 0; i < rule.mesh_axes.size(); ++i) {
      if (rule.mesh_axes[i].empty())
        throw ValueError(fmt::format("{} names an empty mesh axis", rule_label(r)));
      for (size_t j = 0; j < i; ++j)
        if (rule.mesh_axes[j] == rule.mesh_axes[i])
          throw ValueError(fmt::format("{} names mesh axis '{}' twice", rule_label(r), rule.mesh_axes[i]));
    }
    by_name_[rule.logical].push_back(r);
  }
  for (size_t i = 0; i < mesh_axes_.size(); ++i) {
    if (mesh_axes_[i].empty())
      throw ValueError(fmt::format("{}mesh_axes entry {} is an empty name", text_util::what_prefix(source_), i));
    for (size_t j = 0; j < i; ++j)
      if (mesh_axes_[i] == mesh_axes_[j])
        throw ValueError(fmt::format("{}mesh_axes lists '{}' twice", text_util::what_prefix(source_),
                                     mesh_axes_[i]));
  }
}

std::string LogicalRules::rule_label(size_t index) const {
  const LogicalRule& rule = rules_[index];
  std::string target = rule.mesh_axes.empty() ? "[] (unsharded)" : axes_text(rule.mesh_axes);
  std::string label = fmt::format("rule #{} {} -> {}", index + 1, rule.logical, target);
  if (rule.line > 0) label += fmt::format(" [{}:{}]", source_.empty() ? "rules" : source_, rule.line);
  return label;
}

LogicalRules::Flax LogicalRules::run_flax(const LogicalAxes& names, std::string_view what,
                                          Resolution* trace) const {
  const size_t n = names.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] && names[j] && *names[i] == *names[j])
        throw ShardingError(fmt::format(
            "{}logical axis '{}' names both dimension {} and dimension {}; a logical name may "
            "appear only once per array",
            text_util::what_prefix(what), *names[i], j, i));

  // Rules that can match, in rule order. Each rule matches at most one dimension because the
  // names are unique, so scanning these is the same as Flax scanning every rule.
  std::vector<std::pair<size_t, size_t>> candidates;  // (rule, dimension)
  for (size_t d = 0; d < n; ++d) {
    if (!names[d]) continue;
    auto it = by_name_.find(*names[d]);
    if (it == by_name_.end()) continue;
    for (size_t r : it->second) candidates.emplace_back(r, d);
  }
  std::sort(candidates.begin(), candidates.end());

  Flax f;
  f.applied.assign(n, std::nullopt);
  if (trace) {
    trace->dims.assign(n, DimResolution{});
    for (size_t d = 0; d < n; ++d) trace->dims[d].logical = names[d];
  }
  for (auto [r, d] : candidates) {
    RuleTrial trial;
    trial.rule = r;
    if (f.applied[d]) {
      trial.outcome = RuleTrial::Outcome::kDimensionAssigned;
      trial.holder_rule = *f.applied[d];
    } else {
      // The first of the rule's axes that another dimension already uses, if any.
      bool taken = false;
      for (const std::string& axis : rules_[r].mesh_axes) {
        for (size_t e = 0; e < n && !taken; ++e) {
          if (f.applied[e] && holds(rules_[*f.applied[e]].mesh_axes, axis)) {
            taken = true;
            trial.outcome = RuleTrial::Outcome::kAxisTaken;
            trial.axis = axis;
            trial.holder_dim = e;
            trial.holder_rule = *f.applied[e];
          }
        }
        if (taken) break;
      }
      if (taken) {
        f.blocked.emplace_back(d, trial);
      } else {
        f.applied[d] = r;
        trial.outcome = RuleTrial::Outcome::kApplied;
      }
    }
    if (trace) trace->dims[d].trials.push_back(std::move(trial));
  }
  if (trace)
    for (size_t d = 0; d < n; ++d) {
      trace->dims[d].applied_rule = f.applied[d];
      if (f.applied[d]) trace->dims[d].flax = rules_[*f.applied[d]].mesh_axes;
    }
  return f;
}

PartitionSpec LogicalRules::logical_to_mesh_axes(const LogicalAxes& names, std::string_view what) const {
  Flax f = run_flax(names, what, nullptr);
  std::vector<DimSharding> dims(names.size());
  for (size_t d = 0; d < names.size(); ++d)
    if (f.applied[d]) dims[d] = rules_[*f.applied[d]].mesh_axes;
  return PartitionSpec(std::move(dims));
}

PartitionSpec LogicalRules::run(const LogicalAxes& names, const Mesh& mesh,
                                const ResolveOptions& options, const std::optional<Shape>& shape,
                                std::string_view what, Resolution* trace) const {
  const size_t n = names.size();
  if (shape && shape->rank() != n)
    throw ValueError(fmt::format("{}{} logical axes given for shape {} of rank {}", text_util::what_prefix(what), n,
                                 shape->to_string(), shape->rank()));
  if (options.drop_indivisible && !shape)
    throw ValueError(fmt::format("{}dropping indivisible mesh axes needs the array's shape", text_util::what_prefix(what)));

  Flax f = run_flax(names, what, trace);

  if (options.strict) {
    for (size_t d = 0; d < n; ++d) {
      if (!names[d] || f.applied[d]) continue;
      const std::string& name = *names[d];
      if (!has_rule_for(name)) {
        std::string hint;
        size_t best = std::string::npos;
        for (const auto& [known, idx] : by_name_) {
          size_t dist = edit_distance(name, known);
          if (dist <= std::max<size_t>(2, name.size() / 3) && dist < best) {
            best = dist;
            hint = fmt::format("; did you mean '{}'?", known);
          }
        }
        throw ShardingError(fmt::format("{}{}: no rule maps logical axis '{}' (strict mode){}",
                                        text_util::what_prefix(what), dim_name(names, d), name, hint));
      }
      std::vector<std::string> reasons;
      for (const auto& [dim, trial] : f.blocked)
        if (dim == d)
          reasons.push_back(fmt::format("{} needs mesh axis '{}', already used by {} ({})",
                                        rule_label(trial.rule), trial.axis,
                                        dim_name(names, trial.holder_dim), rule_label(trial.holder_rule)));
      throw ShardingError(fmt::format(
          "{}{} ends unsharded because every rule for '{}' is blocked (strict mode): {}",
          text_util::what_prefix(what), dim_name(names, d), name, fmt::join(reasons, "; ")));
    }
  }

  std::vector<DimSharding> dims(n);
  for (size_t d = 0; d < n; ++d) {
    if (!f.applied[d]) continue;
    const LogicalRule& rule = rules_[*f.applied[d]];
    DimSharding axes;
    std::vector<int64_t> sizes;
    for (const std::string& axis : rule.mesh_axes) {
      bool present = mesh.has_axis(axis);
      int64_t size = present ? mesh.axis_size(axis) : 1;
      if (options.remove_size_one_axes && size == 1) {
        if (trace) trace->dims[d].removed_size_one.push_back(axis);
        continue;
      }
      if (!present)
        throw ShardingError(fmt::format(
            "{}{} resolves to mesh axis '{}' by {}, but {} has no such axis (its axes: {})",
            text_util::what_prefix(what), dim_name(names, d), axis, rule_label(*f.applied[d]), mesh.to_string(),
            fmt::join(mesh.axis_names(), ", ")));
      axes.push_back(axis);
      sizes.push_back(size);
    }
    if (options.drop_indivisible) {
      DimSharding kept;
      int64_t blocks = 1;
      for (size_t i = 0; i < axes.size(); ++i) {
        if ((*shape)[d] % (blocks * sizes[i]) == 0) {
          kept.push_back(axes[i]);
          blocks *= sizes[i];
        } else if (trace) {
          trace->dims[d].dropped_indivisible.push_back(axes[i]);
        }
      }
      axes = std::move(kept);
    }
    dims[d] = std::move(axes);
  }
  PartitionSpec spec(std::move(dims));
  if (trace) {
    for (size_t d = 0; d < n; ++d) trace->dims[d].result = spec[d];
    trace->spec = spec;
  }
  return spec;
}

PartitionSpec LogicalRules::resolve(const LogicalAxes& names, const Mesh& mesh,
                                    const ResolveOptions& options, const std::optional<Shape>& shape,
                                    std::string_view what) const {
  return run(names, mesh, options, shape, what, nullptr);
}

Resolution LogicalRules::explain(const LogicalAxes& names, const Mesh& mesh,
                                 const ResolveOptions& options, const std::optional<Shape>& shape,
                                 std::string_view what) const {
  Resolution r;
  run(names, mesh, options, shape, what, &r);
  return r;
}

std::string LogicalRules::describe(const Resolution& resolution, const Mesh& mesh,
                                   const std::optional<Shape>& shape) const {
  std::string out;
  const auto& dims = resolution.dims;
  auto name_of = [&](size_t d) {
    return dims[d].logical ? fmt::format("'{}'", *dims[d].logical) : std::string("(no name)");
  };
  for (size_t d = 0; d < dims.size(); ++d) {
    const DimResolution& dim = dims[d];
    out += fmt::format("  dim {} {}", d, name_of(d));
    if (shape) out += fmt::format(" size {}", (*shape)[d]);
    out += "\n";
    if (!dim.logical) {
      out += "    no logical name: unsharded\n";
    } else if (dim.trials.empty()) {
      out += fmt::format("    no rule for '{}': unsharded\n", *dim.logical);
    }
    for (const RuleTrial& t : dim.trials) {
      switch (t.outcome) {
        case RuleTrial::Outcome::kApplied:
          out += fmt::format("    {}: applied\n", rule_label(t.rule));
          break;
        case RuleTrial::Outcome::kAxisTaken:
          out += fmt::format("    {}: skipped, mesh axis '{}' is already used by dim {} {} (rule #{})\n",
                             rule_label(t.rule), t.axis, t.holder_dim, name_of(t.holder_dim),
                             t.holder_rule + 1);
          break;
        case RuleTrial::Outcome::kDimensionAssigned:
          out += fmt::format("    {}: skipped, dim {} was already assigned by rule #{}\n",
                             rule_label(t.rule), d, t.holder_rule + 1);
          break;
      }
    }
    if (dim.logical && !dim.trials.empty() && !dim.applied_rule)
      out += fmt::format("    every rule for '{}' was blocked: unsharded\n", *dim.logical);
    if (!dim.removed_size_one.empty())
      out += fmt::format("    removed size-1 mesh axes: {}\n", fmt::join(dim.removed_size_one, ", "));
    if (!dim.dropped_indivisible.empty()) {
      std::vector<std::string> dropped;
      for (const auto& a : dim.dropped_indivisible)
        dropped.push_back(fmt::format("{} (size {})", a, mesh.has_axis(a) ? mesh.axis_size(a) : 1));
      out += fmt::format("    dropped mesh axes that do not divide {}: {}\n",
                         shape ? (*shape)[d] : 0, fmt::join(dropped, ", "));
    }
    out += fmt::format("    -> {}\n", axes_text(dim.result));
  }
  out += fmt::format("  spec: {}\n", resolution.spec.to_string());
  return out;
}

}  // namespace tessel
