// Key maps read from YAML: the rules, their steps and the map's variables, with errors naming the
// file, line and key.
#include <algorithm>
#include <cmath>
#include <set>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/checkpoint/key_map.h"
#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"
#include "tessel/detail/yaml_util.h"

namespace tessel {
namespace fs = std::filesystem;
using yaml_util::fail;

namespace {

std::string levels(std::string pattern) {
  std::replace(pattern.begin(), pattern.end(), '.', '/');
  return pattern;
}

constexpr std::string_view kLayer = KeyMapRule::kLayer, kExpert = KeyMapRule::kExpert;
bool has(const std::string& pattern, std::string_view placeholder) {
  return pattern.find(placeholder) != std::string::npos;
}

// A scalar with every "{name}" replaced by its variable.
std::string substituted(const std::string& source, const YAML::Node& n, const std::map<std::string, std::string>& vars,
                        std::string_view what) {
  if (!n.IsScalar()) fail(source, n, fmt::format("{} must be a single value", what));
  const std::string& raw = n.Scalar();
  std::string text;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '{') {
      text += raw[i];
      continue;
    }
    const size_t end = raw.find('}', i);
    if (end == std::string::npos) fail(source, n, fmt::format("{}: '{}' has an unclosed {{", what, raw));
    auto it = vars.find(raw.substr(i + 1, end - i - 1));
    if (it == vars.end())
      fail(source, n, fmt::format("{}: no value for {} (give it in vars: or --map-var)", what, raw.substr(i, end - i + 1)));
    text += it->second;
    i = end;
  }
  return text;
}

// A scalar as an integer, "{name}" taken from the variables.
int64_t int_of(const std::string& source, const YAML::Node& n, const std::map<std::string, std::string>& vars,
               std::string_view what) {
  const std::string text = substituted(source, n, vars, what);
  const auto v = text_util::parse_number<int64_t>(text);
  if (!v) fail(source, n, fmt::format("{} must be an integer, got '{}'", what, text));
  return *v;
}

// "2", "0.5", "sqrt(128)", "1/sqrt({head_dim})": a positive finite factor.
double scale_of(const std::string& source, const YAML::Node& n, const std::map<std::string, std::string>& vars) {
  std::string text = substituted(source, n, vars, "scale");
  std::erase(text, ' ');
  auto term = [&](std::string_view t) {
    const bool root = t.starts_with("sqrt(") && t.ends_with(")");
    if (root) t = t.substr(5, t.size() - 6);
    const auto v = text_util::parse_number<double>(t);
    if (!v || !(*v > 0)) fail(source, n, fmt::format("scale '{}' must be a positive number, sqrt(N) or A/B of those", n.Scalar()));
    return root ? std::sqrt(*v) : *v;
  };
  const size_t slash = text.find('/');
  const double v = slash == std::string::npos ? term(text) : term(text.substr(0, slash)) / term(text.substr(slash + 1));
  if (!(v > 0) || !std::isfinite(v)) fail(source, n, fmt::format("scale '{}' is not a positive finite factor", n.Scalar()));
  return v;
}

std::string pattern_of(const std::string& source, const YAML::Node& rule, std::string_view what) {
  const YAML::Node n = rule[std::string(what)];
  if (!n) fail(source, rule, fmt::format("a rule needs {}", what));
  if (!n.IsScalar() || n.Scalar().empty()) fail(source, n, fmt::format("{} must be a name pattern", what));
  const std::string p = levels(n.Scalar());
  for (std::string_view placeholder : {kLayer, kExpert}) {
    const size_t first = p.find(placeholder);
    if (first != std::string::npos && p.find(placeholder, first + 1) != std::string::npos)
      fail(source, n, fmt::format("{} '{}' holds {} twice", what, n.Scalar(), placeholder));
  }
  for (const std::string_view level : text_util::split(p, '/'))
    if (level.empty()) fail(source, n, fmt::format("{} '{}' has an empty level", what, n.Scalar()));
  return p;
}

}  // namespace

namespace {

KeyMap parse_key_map_node(const YAML::Node& root, const std::string& source,
                          const std::map<std::string, std::string>& given);

}  // namespace

KeyMap parse_key_map(std::string_view yaml, std::string source, const std::map<std::string, std::string>& given) {
  const YAML::Node root = yaml_util::load(yaml, source);
  try {
    return parse_key_map_node(root, source, given);
  } catch (const YAML::Exception& e) {  // a scalar where a map was wanted, a bad boolean, ...
    if (e.mark.is_null()) throw ParseError(source, 0, 0, "bad key map: " + e.msg);
    throw ParseError(source, e.mark.line + 1, e.mark.column + 1, "bad key map: " + e.msg);
  }
}

namespace {

KeyMap parse_key_map_node(const YAML::Node& root, const std::string& source,
                          const std::map<std::string, std::string>& given) {
  if (!root.IsMap()) fail(source, root, "a key map is a mapping with `rules` (and optionally `vars`)");
  std::map<std::string, std::string> vars;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key != "rules" && key != "vars") fail(source, kv.first, fmt::format("unknown key '{}' (expected rules, vars)", key));
  }
  if (root["vars"]) {
    if (!root["vars"].IsMap()) fail(source, root["vars"], "vars must be a mapping of names to values");
    for (const auto& kv : root["vars"]) vars[kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  for (const auto& [k, v] : given) vars[k] = v;
  const YAML::Node rules = root["rules"];
  if (!rules || !rules.IsSequence() || rules.size() == 0) fail(source, root, "rules must be a non-empty list");
  KeyMap map{{}, source};
  for (const YAML::Node& n : rules) {
    if (!n.IsMap()) fail(source, n, "each rule is a mapping with from and to");
    for (const auto& kv : n) {
      const std::string key = kv.first.as<std::string>();
      static const std::set<std::string> known = {"from",   "to",         "transpose", "split", "stack", "stack_experts",
                                                  "layers", "interleave", "take",      "scale", "optional"};
      if (!known.contains(key))
        fail(source, kv.first,
             fmt::format("unknown rule key '{}' (expected from, to, transpose, split, interleave, take, stack, "
                         "stack_experts, layers, scale, optional)", key));
    }
    KeyMapRule r;
    r.from = pattern_of(source, n, "from");
    r.to = pattern_of(source, n, "to");
    if (has(r.to, kLayer) && !has(r.from, kLayer)) fail(source, n["to"], "to has {i} but from has not");
    if (has(r.to, kExpert) && !has(r.from, kExpert)) fail(source, n["to"], "to has {e} but from has not");
    if (const YAML::Node t = n["transpose"]) {
      if (!t.IsSequence()) fail(source, t, "transpose must be a list (a permutation)");
      for (const YAML::Node& p : t) r.transpose.push_back(int_of(source, p, vars, "transpose"));
      std::vector<int64_t> sorted = r.transpose;
      std::sort(sorted.begin(), sorted.end());
      for (size_t k = 0; k < sorted.size(); ++k)
        if (sorted[k] != static_cast<int64_t>(k)) fail(source, t, "transpose is not a permutation of 0..rank-1");
    }
    if (const YAML::Node s = n["split"]) {
      if (!s.IsSequence() || s.size() != 2 || !s[1].IsSequence() || s[1].size() < 1)
        fail(source, s, "split is [axis, [size, ...]]");
      r.split_axis = int_of(source, s[0], vars, "split axis");
      int unknowns = 0;
      for (const YAML::Node& x : s[1]) {
        r.split_sizes.push_back(int_of(source, x, vars, "split size"));
        if (r.split_sizes.back() == -1) ++unknowns;
        else if (r.split_sizes.back() <= 0) fail(source, x, "split sizes are positive, or -1 once");
      }
      if (unknowns > 1 || *r.split_axis < 0) fail(source, s, "split has more than one -1 or a negative axis");
    }
    if (const YAML::Node s = n["stack"]) {
      r.stack = int_of(source, s, vars, "stack");
      if (*r.stack < 0) fail(source, s, "stack must be a non-negative axis");
    }
    if (has(r.from, kLayer) && !has(r.to, kLayer) && !r.stack)
      fail(source, n, "from has {i} and to has not: say along which axis the layers stack (stack: AXIS)");
    if (r.stack && !(has(r.from, kLayer) && !has(r.to, kLayer)))
      fail(source, n["stack"], "stack needs {i} in from and not in to");
    if (const YAML::Node s = n["stack_experts"]) {
      r.stack_experts = int_of(source, s, vars, "stack_experts");
      if (*r.stack_experts < 0) fail(source, s, "stack_experts must be a non-negative axis");
      if (!(has(r.from, kExpert) && !has(r.to, kExpert))) fail(source, s, "stack_experts needs {e} in from and not in to");
      if (r.stack && *r.stack == *r.stack_experts) fail(source, s, "stack and stack_experts must be different axes");
    }
    if (const YAML::Node l = n["layers"]) {
      if (!l.IsSequence() || l.size() < 1 || l.size() > 2) fail(source, l, "layers is [START] or [START, STOP]");
      if (!has(r.from, kLayer)) fail(source, l, "layers needs {i} in from");
      r.layer_start = int_of(source, l[0], vars, "layers start");
      if (l.size() == 2) r.layer_stop = int_of(source, l[1], vars, "layers stop");
      if (r.layer_start < 0 || (r.layer_stop && *r.layer_stop < r.layer_start))
        fail(source, l, "layers must be 0 <= START <= STOP");
    }
    if (has(r.from, kExpert) && !has(r.to, kExpert) && !r.stack_experts)
      fail(source, n, "from has {e} and to has not: say along which axis the experts stack (stack_experts: AXIS)");
    if (const YAML::Node i = n["interleave"]) {
      r.interleave = int_of(source, i, vars, "interleave");
      if (*r.interleave < 0) fail(source, i, "interleave must be a non-negative axis");
    }
    if (const YAML::Node t = n["take"]) {
      if (!t.IsSequence() || t.size() != 3) fail(source, t, "take is [axis, start, step]");
      r.take = KeyMapRule::Take{int_of(source, t[0], vars, "take axis"), int_of(source, t[1], vars, "take start"),
                                int_of(source, t[2], vars, "take step")};
      if (r.take->axis < 0 || r.take->step < 2 || r.take->start < 0 || r.take->start >= r.take->step)
        fail(source, t, "take needs axis >= 0, step >= 2 and 0 <= start < step");
    }
    if (const YAML::Node f = n["scale"]) r.scale = scale_of(source, f, vars);
    if (const YAML::Node o = n["optional"]) r.optional = o.as<bool>();
    map.rules.push_back(std::move(r));
  }
  return map;
}

}  // namespace

KeyMap load_key_map(const fs::path& file, const std::map<std::string, std::string>& vars) {
  return parse_key_map(detail::read_file(file, int64_t{16} << 20), file.string(), vars);
}

std::map<std::string, std::string> parse_map_vars(std::string_view text) {
  std::map<std::string, std::string> out;
  for (auto& [name, value] : text_util::parse_assignments(text, "--map-var", "NAME=VALUE")) out[name] = value;
  return out;
}

}  // namespace tessel
