#include "tessel/checkpoint/key_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "tessel/checkpoint/detail/io/file_io.h"
#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/half.h"
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

// The placeholders: a layer index {i} and an expert index {e}.
constexpr std::string_view kLayer = "{i}", kExpert = "{e}";
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

// A pattern as a regex, with the capture groups of {i} and {e} (0: absent).
struct Pattern {
  std::regex re;
  size_t layer = 0, expert = 0;
};

Pattern regex_of(const std::string& pattern) {
  Pattern out;
  std::string r;
  size_t groups = 0;
  for (size_t k = 0; k < pattern.size(); ++k) {
    if (pattern.compare(k, 3, kLayer) == 0 || pattern.compare(k, 3, kExpert) == 0) {
      (pattern.compare(k, 3, kLayer) == 0 ? out.layer : out.expert) = ++groups;
      r += "([0-9]+)";
      k += 2;
    } else if (std::string_view("\\^$.|?*+()[]{}").find(pattern[k]) != std::string_view::npos) {
      r += '\\';
      r += pattern[k];
    } else {
      r += pattern[k];
    }
  }
  out.re = std::regex(r);
  return out;
}

// The pattern with {i} = i and {e} = e (where >= 0).
std::string with_indices(std::string pattern, int64_t i, int64_t e) {
  for (auto [placeholder, v] : {std::pair{kLayer, i}, {kExpert, e}}) {
    const size_t at = pattern.find(placeholder);
    if (at != std::string::npos && v >= 0) pattern.replace(at, 3, std::to_string(v));
  }
  return pattern;
}

// Shapes through the steps, forward and back.
void check_rank(const Shape& s, const std::vector<int64_t>& perm) {
  if (perm.size() != s.rank())
    throw ValueError(fmt::format("a transpose of {} axes does not fit a rank-{} tensor {}", perm.size(), s.rank(),
                                 s.to_string()));
}

Shape transposed(const Shape& s, const std::vector<int64_t>& perm) {
  if (perm.empty()) return s;
  check_rank(s, perm);
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(s[static_cast<size_t>(p)]);
  return Shape(std::move(out));
}
Shape untransposed(const Shape& s, const std::vector<int64_t>& perm) {
  if (perm.empty()) return s;
  check_rank(s, perm);
  std::vector<int64_t> out(s.rank());
  for (size_t k = 0; k < perm.size(); ++k) out[static_cast<size_t>(perm[k])] = s[k];
  return Shape(std::move(out));
}
std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inv[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
  return inv;
}

Shape split_shape(const KeyMapRule& r, const Shape& s, const std::string& what) {
  if (!r.split_axis) return s;
  const auto axis = static_cast<size_t>(*r.split_axis);
  if (axis >= s.rank()) throw ValueError(fmt::format("{}: split axis {} of a rank-{} tensor", what, axis, s.rank()));
  int64_t known = 1, unknown = -1;
  for (size_t k = 0; k < r.split_sizes.size(); ++k) {
    if (r.split_sizes[k] == -1) {
      unknown = static_cast<int64_t>(k);
    } else {
      known *= r.split_sizes[k];
    }
  }
  std::vector<int64_t> sizes = r.split_sizes;
  if (unknown >= 0) sizes[static_cast<size_t>(unknown)] = known > 0 ? s[axis] / known : 0;
  if (std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>()) != s[axis])
    throw ValueError(fmt::format("{}: dimension {} ({}) does not split into {}", what, axis, s[axis],
                                 fmt::join(r.split_sizes, ", ")));
  std::vector<int64_t> out(s.dims().begin(), s.dims().begin() + static_cast<long>(axis));
  out.insert(out.end(), sizes.begin(), sizes.end());
  out.insert(out.end(), s.dims().begin() + static_cast<long>(axis) + 1, s.dims().end());
  return Shape(std::move(out));
}

bool scalable(DType d) { return d == DType::kF64 || d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// The value steps fit the tensor: the split layout `s` has the interleave axis, even, and a scale
// has floating-point values to multiply.
void check_value_steps(const KeyMapRule& r, const Shape& s, DType dtype, const std::string& what) {
  if (r.interleave) {
    const auto axis = static_cast<size_t>(*r.interleave);
    if (axis >= s.rank() || s[axis] % 2 != 0)
      throw ValueError(fmt::format("{}: interleave axis {} needs an even dimension of {}", what, axis, s.to_string()));
  }
  if (r.scale && !scalable(dtype))
    throw ValueError(fmt::format("{}: scale applies to f64, f32, bf16 and f16 tensors, not {}", what, name(dtype)));
}

// Along `axis`, halves to neighbours (out[2k] = in[k], out[2k+1] = in[k + n/2]) or back.
HostArray interleaved(const HostArray& in, size_t axis, bool forward) {
  const Shape& s = in.shape();
  const size_t item = item_size(in.dtype());
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.rank(); ++d) inner *= s[d];
  const int64_t n = s[axis], half = n / 2;
  const auto block = static_cast<size_t>(inner) * item;
  HostArray out(s, in.dtype());
  const std::byte* src = in.bytes().data();
  std::byte* dst = out.mutable_bytes().data();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t paired = k < half ? 2 * k : 2 * (k - half) + 1;  // halves index k -> neighbours index
      const int64_t from = forward ? k : paired, to = forward ? paired : k;
      std::memcpy(dst + static_cast<size_t>(o * n + to) * block, src + static_cast<size_t>(o * n + from) * block, block);
    }
  }
  return out;
}

Shape merge_shape(const KeyMapRule& r, const Shape& s, const std::string& what) {
  if (!r.split_axis) return s;
  const auto axis = static_cast<size_t>(*r.split_axis), n = r.split_sizes.size();
  if (axis + n > s.rank()) throw ValueError(fmt::format("{}: rank {} is too small to merge a split", what, s.rank()));
  for (size_t k = 0; k < n; ++k)
    if (r.split_sizes[k] != -1 && r.split_sizes[k] != s[axis + k])
      throw ValueError(fmt::format("{}: dimension {} is {}, the map splits it as {}", what, axis + k, s[axis + k],
                                   r.split_sizes[k]));
  int64_t merged = 1;
  for (size_t k = 0; k < n; ++k) merged *= s[axis + k];
  std::vector<int64_t> out(s.dims().begin(), s.dims().begin() + static_cast<long>(axis));
  out.push_back(merged);
  out.insert(out.end(), s.dims().begin() + static_cast<long>(axis + n), s.dims().end());
  return Shape(std::move(out));
}

Shape insert_axis(const Shape& s, size_t axis, int64_t n) {
  std::vector<int64_t> d = s.dims();
  d.insert(d.begin() + static_cast<long>(axis), n);
  return Shape(std::move(d));
}
Shape remove_axis(const Shape& s, size_t axis) {
  std::vector<int64_t> d = s.dims();
  d.erase(d.begin() + static_cast<long>(axis));
  return Shape(std::move(d));
}

// A permuted copy: out[k] = in[perm[k]] per dimension.
HostArray transpose(const HostArray& in, const std::vector<int64_t>& perm) {
  if (perm.empty()) return in;
  const Shape& s = in.shape();
  const size_t rank = s.rank(), item = item_size(in.dtype());
  HostArray out(transposed(s, perm), in.dtype());
  if (s.num_elements() == 0) return out;
  std::vector<int64_t> in_strides(rank, 1);
  for (size_t d = rank; d-- > 1;) in_strides[d - 1] = in_strides[d] * s[d];
  std::vector<int64_t> stride(rank);  // input stride of each output dimension
  for (size_t k = 0; k < rank; ++k) stride[k] = in_strides[static_cast<size_t>(perm[k])];
  const Shape& o = out.shape();
  const std::byte* src = in.bytes().data();
  std::byte* dst = out.mutable_bytes().data();
  std::vector<int64_t> at(rank, 0);
  const int64_t inner = o[rank - 1], inner_stride = stride[rank - 1];
  for (int64_t row = 0, rows = o.num_elements() / inner; row < rows; ++row) {
    int64_t base = 0;
    for (size_t k = 0; k + 1 < rank; ++k) base += at[k] * stride[k];
    for (int64_t j = 0; j < inner; ++j, dst += item)
      std::memcpy(dst, src + (base + j * inner_stride) * static_cast<int64_t>(item), item);
    for (size_t k = rank - 1; k-- > 0;) {
      if (++at[k] < o[k]) break;
      at[k] = 0;
    }
  }
  return out;
}

HostArray reshaped(HostArray a, const Shape& shape) {
  return HostArray(shape, a.dtype(), std::vector<std::byte>(a.bytes().begin(), a.bytes().end()));
}

// Every value times `factor`: in double for f64, in float32 for the narrower floats (as NumPy's
// astype(float32) * float32(factor) then astype back).
void scale_values(HostArray& a, double factor, const std::string& path) {
  const auto f = static_cast<float>(factor);
  switch (a.dtype()) {
    case DType::kF64:
      for (double& v : a.mutable_values<double>()) v *= factor;
      return;
    case DType::kF32:
      for (float& v : a.mutable_values<float>()) v *= f;
      return;
    case DType::kBF16:
      for (uint16_t& v : std::span(reinterpret_cast<uint16_t*>(a.mutable_bytes().data()), a.mutable_bytes().size() / 2))
        v = f32_to_bf16(bf16_to_f32(v) * f);
      return;
    case DType::kF16:
      for (uint16_t& v : std::span(reinterpret_cast<uint16_t*>(a.mutable_bytes().data()), a.mutable_bytes().size() / 2))
        v = f32_to_f16(f16_to_f32(v) * f);
      return;
    default:  // plan_key_map refuses the other dtypes
      throw ValueError(fmt::format("'{}': scale applies to f64, f32, bf16 and f16 tensors, not {}", path,
                                   a.type_string()));
  }
}

// The box of one position along each of `axes`.
Box slice_box(const Shape& shape, const std::vector<int64_t>& axes, const std::vector<int64_t>& index) {
  std::vector<int64_t> start(shape.rank(), 0), stop(shape.dims());
  for (size_t k = 0; k < axes.size(); ++k) {
    start[static_cast<size_t>(axes[k])] = index[k];
    stop[static_cast<size_t>(axes[k])] = index[k] + 1;
  }
  return Box(std::move(start), std::move(stop));
}

// The row-major position of the n-th member of a grid with these counts.
std::vector<int64_t> unravel(int64_t n, const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size());
  for (size_t k = counts.size(); k-- > 0;) {
    at[k] = n % counts[k];
    n /= counts[k];
  }
  return at;
}

// A rule's stacked axes in ascending order, each with the placeholder it stacks.
std::vector<std::pair<int64_t, std::string_view>> stack_axes(const KeyMapRule& r) {
  std::vector<std::pair<int64_t, std::string_view>> out;
  if (r.stack) out.emplace_back(*r.stack, kLayer);
  if (r.stack_experts) out.emplace_back(*r.stack_experts, kExpert);
  std::sort(out.begin(), out.end());
  return out;
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
      static const std::set<std::string> known = {"from",  "to",         "transpose", "split",  "stack",
                                                  "stack_experts", "layers", "interleave", "scale", "optional"};
      if (!known.contains(key))
        fail(source, kv.first,
             fmt::format("unknown rule key '{}' (expected from, to, transpose, split, interleave, stack, "
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

MapPlan plan_key_map(const KeyMap& map, const State& source) {
  std::vector<Pattern> from, to;
  for (const KeyMapRule& r : map.rules) {
    from.push_back(regex_of(r.from));
    to.push_back(regex_of(r.to));
  }
  // The first rule whose pattern (one side) matches each source path, with its {i} and {e}.
  struct Match {
    size_t rule;
    int64_t layer, expert;  // -1: not in the pattern
  };
  // Matching `from` names, a rule takes only the layers in its range, numbered from its start.
  auto match_all = [&](const std::vector<Pattern>& patterns, bool from_side, std::vector<std::string>& unmatched) {
    std::map<std::string, Match, PathLess> out;
    for (const auto& entry : source) {
      const std::string& path = entry.first;
      bool found = false;
      for (size_t r = 0; r < patterns.size() && !found; ++r) {
        std::smatch m;
        if (std::regex_match(path, m, patterns[r].re)) {
          auto group = [&](size_t g) -> int64_t {
            if (g == 0) return -1;
            const auto n = text_util::parse_number<int64_t>(m[g].str());
            if (!n || *n > (int64_t{1} << 40))
              throw ValueError(fmt::format("{}: '{}' has an index out of range", map.source, path));
            return *n;
          };
          Match match{r, group(patterns[r].layer), group(patterns[r].expert)};
          const KeyMapRule& rule = map.rules[r];
          if (from_side && match.layer >= 0) {
            if (match.layer < rule.layer_start || (rule.layer_stop && match.layer >= *rule.layer_stop)) continue;
            match.layer -= rule.layer_start;
          }
          out.emplace(path, match);
          found = true;
        }
      }
      if (!found) unmatched.push_back(path);
    }
    return out;
  };
  std::vector<std::string> unmatched_forward, unmatched_backward;
  const auto forward = match_all(from, true, unmatched_forward);
  const auto backward = match_all(to, false, unmatched_backward);
  const bool fwd = unmatched_forward.empty(), bwd = unmatched_backward.empty();
  if (fwd && bwd && !source.empty() && !forward.empty())
    throw ValueError(map.source + ": the source's names match both sides of the map; which way is meant?");
  if (!fwd && !bwd) {
    const bool closer = unmatched_forward.size() <= unmatched_backward.size();
    const auto& missing = closer ? unmatched_forward : unmatched_backward;
    std::vector<std::string> show(missing.begin(), missing.begin() + static_cast<long>(std::min<size_t>(missing.size(), 8)));
    throw ValueError(fmt::format("{}: no rule's {} matches {} of the source's tensors: {}{}", map.source,
                                 closer ? "from" : "to", missing.size(), fmt::join(show, ", "),
                                 missing.size() > show.size() ? ", ..." : ""));
  }
  const auto& matches = fwd ? forward : backward;
  MapPlan plan;
  plan.forward = fwd;
  // Group by rule and target.
  std::vector<size_t> used(map.rules.size(), 0);
  // target -> (its position along the stacked axes, ascending; source)
  std::map<std::string, std::vector<std::pair<std::vector<int64_t>, std::string>>> stacks;
  std::map<std::string, size_t> stack_rule;
  for (const auto& [path, m] : matches) {
    const KeyMapRule& r = map.rules[m.rule];
    const Variable& v = source.at(path);
    ++used[m.rule];
    const std::string what = fmt::format("'{}' ({} {})", path, map.source, fwd ? r.from : r.to);
    if (fwd) {
      if (r.transpose.size() && r.transpose.size() != v.shape().rank())
        throw ValueError(fmt::format("{}: transpose of {} axes for a rank-{} tensor", what, r.transpose.size(),
                                     v.shape().rank()));
      const Shape s = split_shape(r, transposed(v.shape(), r.transpose), what);
      check_value_steps(r, s, v.dtype(), what);
      const auto axes = stack_axes(r);
      if (!axes.empty()) {
        std::vector<int64_t> at;
        for (const auto& [axis, placeholder] : axes) at.push_back(placeholder == kLayer ? m.layer : m.expert);
        const std::string target = with_indices(r.to, m.layer, m.expert);
        stacks[target].emplace_back(std::move(at), path);
        stack_rule[target] = m.rule;
        continue;
      }
      plan.tensors.push_back({with_indices(r.to, m.layer, m.expert), s, v.dtype(), {path}, {}, {}, {}, &r, true});
    } else {
      const auto axes = stack_axes(r);
      if (!axes.empty()) {  // unstack: one target per layer (and expert)
        std::vector<int64_t> unstack, counts;
        Shape slice = v.shape();
        for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
          const auto axis = static_cast<size_t>(it->first);
          if (axis >= slice.rank())
            throw ValueError(fmt::format("{}: no axis {} to unstack in a rank-{} tensor", what, axis, v.shape().rank()));
          slice = remove_axis(slice, axis);
        }
        for (const auto& [axis, placeholder] : axes) {
          unstack.push_back(axis);
          counts.push_back(v.shape()[static_cast<size_t>(axis)]);
        }
        check_value_steps(r, slice, v.dtype(), what);
        const Shape s = untransposed(merge_shape(r, slice, what), r.transpose);
        int64_t total = 1;
        for (int64_t c : counts) total *= c;
        for (int64_t n = 0; n < total; ++n) {
          std::vector<int64_t> at = unravel(n, counts);
          int64_t layer = m.layer, expert = m.expert;
          for (size_t k = 0; k < axes.size(); ++k) (axes[k].second == kLayer ? layer : expert) = at[k];
          plan.tensors.push_back({with_indices(r.from, layer < 0 ? layer : layer + r.layer_start, expert), s, v.dtype(),
                                  {path}, {}, unstack, at, &r, false});
        }
      } else {
        if (r.transpose.size() && r.transpose.size() != merge_shape(r, v.shape(), what).rank())
          throw ValueError(fmt::format("{}: transpose of {} axes does not fit", what, r.transpose.size()));
        check_value_steps(r, v.shape(), v.dtype(), what);
        const Shape s = untransposed(merge_shape(r, v.shape(), what), r.transpose);
        plan.tensors.push_back({with_indices(r.from, m.layer < 0 ? m.layer : m.layer + r.layer_start, m.expert), s,
                                v.dtype(), {path}, {}, {}, {}, &r, false});
      }
    }
  }
  for (auto& [target, members] : stacks) {
    const KeyMapRule& r = map.rules[stack_rule[target]];
    const auto axes = stack_axes(r);
    std::sort(members.begin(), members.end());
    // The members must fill the grid 0..n-1 along each stacked axis, each position once.
    std::vector<int64_t> counts(axes.size(), 0);
    for (const auto& [at, p] : members)
      for (size_t k = 0; k < at.size(); ++k) counts[k] = std::max(counts[k], at[k] + 1);
    for (size_t n = 0; n < members.size(); ++n) {
      const std::vector<int64_t> want = unravel(static_cast<int64_t>(n), counts);
      if (members[n].first != want) {
        std::vector<std::string> at;
        for (size_t k = 0; k < axes.size(); ++k)
          at.push_back(fmt::format("{} {}", axes[k].second == kLayer ? "layer" : "expert", want[k]));
        throw ValueError(fmt::format("{}: '{}' has no source for {} (layers and experts stack 0..n-1 without gaps, "
                                     "each once)", map.source, target, fmt::join(at, ", ")));
      }
    }
    int64_t total = 1;
    for (int64_t c : counts) total *= c;
    if (static_cast<int64_t>(members.size()) != total)
      throw ValueError(fmt::format("{}: '{}' does not have every layer and expert", map.source, target));
    const Variable& first = source.at(members.front().second);
    std::vector<std::string> paths;
    for (const auto& [at, p] : members) {
      const Variable& v = source.at(p);
      if (v.shape() != first.shape() || v.dtype() != first.dtype())
        throw ValueError(fmt::format("{}: '{}' is {} but '{}' is {}: layers and experts stack only when alike",
                                     map.source, p, type_string(v.dtype(), v.shape()), members.front().second,
                                     type_string(first.dtype(), first.shape())));
      paths.push_back(p);
    }
    Shape s = split_shape(r, transposed(first.shape(), r.transpose), "'" + target + "'");
    std::vector<int64_t> stack;
    for (size_t k = 0; k < axes.size(); ++k) {
      const auto axis = static_cast<size_t>(axes[k].first);
      if (axis > s.rank())
        throw ValueError(fmt::format("{}: stack axis {} past the rank {} of '{}'", map.source, axis, s.rank(), target));
      s = insert_axis(s, axis, counts[k]);
      stack.push_back(axes[k].first);
    }
    plan.tensors.push_back({target, s, first.dtype(), paths, stack, {}, {}, &r, true});
  }
  std::vector<std::string> unused;
  for (size_t r = 0; r < map.rules.size(); ++r)
    if (used[r] == 0 && !map.rules[r].optional) unused.push_back(fwd ? map.rules[r].from : map.rules[r].to);
  if (!unused.empty())
    throw ValueError(fmt::format("{}: these rules match none of the source's tensors (mark them optional: true if "
                                 "they may): {}", map.source, fmt::join(unused, ", ")));
  for (const MappedTensor& t : plan.tensors) {
    if (plan.target.contains(t.path)) throw ValueError(fmt::format("{}: two tensors map to '{}'", map.source, t.path));
    plan.target.insert(t.path, Variable::abstract(kParam, t.shape, t.dtype));
  }
  return plan;
}

namespace {

// The target's layout (transposed, split, interleaved, stacked; or the way back) of its sources.
HostArray apply_layout(const MappedTensor& t, const std::vector<const HostArray*>& sources) {
  const KeyMapRule& r = *t.rule;
  const size_t item = item_size(t.dtype);
  if (t.forward) {
    auto one = [&](const HostArray& a) {
      HostArray split = reshaped(transpose(a, r.transpose), split_shape(r, transposed(a.shape(), r.transpose), t.path));
      return r.interleave ? interleaved(split, static_cast<size_t>(*r.interleave), true) : split;
    };
    if (t.stack.empty()) return one(*sources.front());
    HostArray out(t.shape, t.dtype);
    std::vector<int64_t> counts;
    for (int64_t axis : t.stack) counts.push_back(t.shape[static_cast<size_t>(axis)]);
    for (size_t i = 0; i < sources.size(); ++i) {
      const HostArray slice = one(*sources[i]);
      const Box dst = slice_box(t.shape, t.stack, unravel(static_cast<int64_t>(i), counts));
      copy_region(slice.bytes().data(), dst, out.mutable_bytes().data(), Box::full(t.shape), dst, item);
    }
    return out;
  }
  const HostArray& src = *sources.front();
  HostArray piece = src;
  if (!t.unstack.empty()) {
    const Box region = slice_box(src.shape(), t.unstack, t.index);
    Shape s = src.shape();
    for (auto it = t.unstack.rbegin(); it != t.unstack.rend(); ++it) s = remove_axis(s, static_cast<size_t>(*it));
    HostArray slice(s, t.dtype);
    copy_region(src.bytes().data(), Box::full(src.shape()), slice.mutable_bytes().data(), region, region, item);
    piece = std::move(slice);
  }
  if (r.interleave) piece = interleaved(piece, static_cast<size_t>(*r.interleave), false);
  const Shape merged = merge_shape(r, piece.shape(), t.path);
  return transpose(reshaped(std::move(piece), merged), r.transpose.empty() ? r.transpose : inverse(r.transpose));
}

}  // namespace

HostArray apply_mapped(const MappedTensor& t, const std::vector<const HostArray*>& sources) {
  HostArray out = apply_layout(t, sources);
  if (t.rule->scale) scale_values(out, t.forward ? *t.rule->scale : 1.0 / *t.rule->scale, t.path);
  return out;
}

}  // namespace tessel
