// State is the ordered map path -> Variable of a model (Flax NNX's State, flattened). Paths are
// '/'-joined ("decoder/layers/3/mlp/wi/kernel") and kept in natural order (layers/2 before
// layers/10), so every listing, plan and checkpoint sees the same order.
//
// Filters select variables by kind, path substring or regex, and combine with any/all/not
// (operators |, &, !). split() partitions a State by filters, merge() puts the parts back.
//
//   auto [params, rest] = state.split(tessel::Filter::kind(tessel::kParam), tessel::Filter::all());
//   auto mlp = params.filter(tessel::Filter::path_contains("mlp") & !tessel::Filter::path_regex("bias$"));
//   tessel::State::merge({params, rest}) == state (same paths, same variables)
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/state/variable.h"

namespace tessel {

// Natural order of paths: runs of digits compare as numbers.
struct PathLess {
  bool operator()(std::string_view a, std::string_view b) const;
  using is_transparent = void;
};

class Filter {
 public:
  using Predicate = std::function<bool(const std::string& path, const Variable& variable)>;
  Filter(Predicate predicate, std::string description);

  static Filter all();                               // Flax's `...`
  static Filter none();
  static Filter kind(std::string kind);              // Flax's nnx.Param etc.
  static Filter path_contains(std::string text);
  static Filter path_regex(const std::string& pattern);  // std::regex ECMAScript, searched; throws ValueError
  static Filter any_of(std::vector<Filter> filters);
  static Filter all_of(std::vector<Filter> filters);
  static Filter negate(Filter filter);

  bool operator()(const std::string& path, const Variable& variable) const {
    return predicate_(path, variable);
  }
  const std::string& description() const { return description_; }  // "kind(param) & !path~bias"

  friend Filter operator|(Filter a, Filter b) { return any_of({std::move(a), std::move(b)}); }
  friend Filter operator&(Filter a, Filter b) { return all_of({std::move(a), std::move(b)}); }
  friend Filter operator!(Filter a) { return negate(std::move(a)); }

 private:
  Predicate predicate_;
  std::string description_;
};

class State {
 public:
  using Map = std::map<std::string, Variable, PathLess>;

  State() = default;
  // Throws ValueError on an empty path, an empty segment or a leading/trailing '/'.
  void insert(std::string path, Variable variable);
  // Replaces an existing path's variable; throws ValueError if the path is absent.
  void replace(const std::string& path, Variable variable);

  bool contains(std::string_view path) const { return vars_.find(path) != vars_.end(); }
  const Variable& at(std::string_view path) const;  // throws ValueError naming near paths
  size_t size() const { return vars_.size(); }
  bool empty() const { return vars_.empty(); }
  auto begin() const { return vars_.begin(); }
  auto end() const { return vars_.end(); }
  std::vector<std::string> paths() const;

  State filter(const Filter& filter) const;
  // One State per filter; a variable goes to the first filter that matches it. Throws ValueError
  // naming a variable no filter matches (pass Filter::all() last to collect the rest).
  std::vector<State> split(const std::vector<Filter>& filters) const;
  template <typename... F>
  auto split(F... filters) const {
    std::vector<State> parts = split(std::vector<Filter>{std::move(filters)...});
    return to_tuple(std::move(parts), std::index_sequence_for<F...>{});
  }
  // The union of `parts`; throws ValueError naming a path that two parts both hold.
  static State merge(const std::vector<State>& parts);

  // Bytes of every variable (global sizes, not per device).
  int64_t nbytes() const;
  // Every variable without its value.
  State to_abstract() const;
  // One line per variable: path, kind, type, sharding.
  std::string to_string() const;

 private:
  template <size_t... I>
  static auto to_tuple(std::vector<State>&& parts, std::index_sequence<I...>) {
    return std::make_tuple(std::move(parts[I])...);
  }
  Map vars_;
};

}  // namespace tessel
