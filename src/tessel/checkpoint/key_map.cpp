// Key maps planned and applied: which source tensors make which target, in which direction, and
// the steps on their values, whole or a piece at a time.
#include "tessel/checkpoint/key_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "tessel/core/box_copy.h"
#include "tessel/core/error.h"
#include "tessel/core/half.h"
#include "tessel/core/permute.h"
#include "tessel/detail/text_util.h"

namespace tessel {

namespace {

constexpr std::string_view kLayer = KeyMapRule::kLayer, kExpert = KeyMapRule::kExpert;

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

// The shape a take leaves (forward), and the one its parts fill back (backward).
Shape take_shape(const KeyMapRule& r, const Shape& s, const std::string& what) {
  if (!r.take) return s;
  const auto axis = static_cast<size_t>(r.take->axis);
  if (axis >= s.rank() || s[axis] % r.take->step != 0)
    throw ValueError(fmt::format("{}: take [{}, {}, {}] needs an axis {} whose size divides by {} in {}", what,
                                 r.take->axis, r.take->start, r.take->step, axis, r.take->step, s.to_string()));
  std::vector<int64_t> d = s.dims();
  d[axis] /= r.take->step;
  return Shape(std::move(d));
}
Shape untake_shape(const KeyMapRule& r, const Shape& s, const std::string& what) {
  if (!r.take) return s;
  const auto axis = static_cast<size_t>(r.take->axis);
  if (axis >= s.rank())
    throw ValueError(fmt::format("{}: take axis {} of a rank-{} tensor", what, axis, s.rank()));
  std::vector<int64_t> d = s.dims();
  d[axis] *= r.take->step;
  return Shape(std::move(d));
}

// Rows of `axis` (with everything after it) as runs of bytes: `outer` runs before, `inner` bytes each.
struct AxisRuns {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisRuns runs_along(const Shape& s, size_t axis, size_t item) {
  AxisRuns r;
  for (size_t d = 0; d < axis; ++d) r.outer *= s[d];
  r.n = s[axis];
  r.inner = static_cast<int64_t>(item);
  for (size_t d = axis + 1; d < s.rank(); ++d) r.inner *= s[d];
  return r;
}

// Every `step`-th row of `axis` from `start`.
HostArray take_rows(const HostArray& in, const KeyMapRule::Take& t) {
  const auto axis = static_cast<size_t>(t.axis);
  std::vector<int64_t> d = in.shape().dims();
  d[axis] /= t.step;
  HostArray out(Shape(std::move(d)), in.dtype());
  const AxisRuns from = runs_along(in.shape(), axis, item_size(in.dtype()));
  const int64_t rows = from.n / t.step;
  for (int64_t o = 0; o < from.outer; ++o)
    for (int64_t k = 0; k < rows; ++k)
      std::memcpy(out.mutable_bytes().data() + (o * rows + k) * from.inner,
                  in.bytes().data() + (o * from.n + t.start + k * t.step) * from.inner, static_cast<size_t>(from.inner));
  return out;
}

// The parts of a take (ordered by start, 0..step-1) put back together along `axis`.
HostArray untake_rows(const std::vector<HostArray>& parts, size_t axis) {
  const auto step = static_cast<int64_t>(parts.size());
  std::vector<int64_t> d = parts.front().shape().dims();
  d[axis] *= step;
  HostArray out(Shape(std::move(d)), parts.front().dtype());
  const AxisRuns part = runs_along(parts.front().shape(), axis, item_size(out.dtype()));
  for (int64_t p = 0; p < step; ++p)
    for (int64_t o = 0; o < part.outer; ++o)
      for (int64_t k = 0; k < part.n; ++k)
        std::memcpy(out.mutable_bytes().data() + (o * part.n * step + p + k * step) * part.inner,
                    parts[static_cast<size_t>(p)].bytes().data() + (o * part.n + k) * part.inner,
                    static_cast<size_t>(part.inner));
  return out;
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
  HostArray out(transposed(in.shape(), perm), in.dtype());
  permute_copy(in.bytes().data(), in.shape(), item_size(in.dtype()), perm, out.mutable_bytes().data());
  return out;
}

HostArray reshaped(HostArray a, const Shape& shape) {
  a.reshape(shape);
  return a;
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

// Rules alike but for their take's start: the parts of one tensor.
bool parts_alike(const KeyMapRule& a, const KeyMapRule& b) {
  return a.transpose == b.transpose && a.split_axis == b.split_axis && a.split_sizes == b.split_sizes &&
         a.interleave == b.interleave && a.scale == b.scale && a.stack == b.stack &&
         a.stack_experts == b.stack_experts && a.take && b.take && a.take->axis == b.take->axis &&
         a.take->step == b.take->step;
}

// Backward: the targets that takes' parts make (one per rule, the same path) become one, its
// sources ordered by the takes' starts, which must be 0..step-1 with rules and sources alike.
std::vector<MappedTensor> with_takes_together(std::vector<MappedTensor> tensors, const State& source,
                                              const std::string& map_name) {
  std::vector<MappedTensor> out;
  std::map<std::string, size_t> slot;  // a take's target -> its place in `out`
  std::map<std::string, std::vector<MappedTensor>> parts;
  for (MappedTensor& t : tensors) {
    if (!t.rule->take) {
      out.push_back(std::move(t));
      continue;
    }
    if (slot.emplace(t.path, out.size()).second) out.emplace_back();
    parts[t.path].push_back(std::move(t));
  }
  for (auto& [path, ps] : parts) {
    std::sort(ps.begin(), ps.end(),
              [](const MappedTensor& a, const MappedTensor& b) { return a.rule->take->start < b.rule->take->start; });
    const MappedTensor& first = ps.front();
    const Variable& first_source = source.at(first.sources.front());
    bool alike = static_cast<int64_t>(ps.size()) == first.rule->take->step;
    std::vector<std::string> names;
    for (size_t k = 0; k < ps.size(); ++k) {
      const Variable& v = source.at(ps[k].sources.front());
      alike = alike && ps[k].rule->take->start == static_cast<int64_t>(k) && parts_alike(*ps[k].rule, *first.rule) &&
              ps[k].index == first.index && v.shape() == first_source.shape() && v.dtype() == first_source.dtype();
      names.push_back(fmt::format("'{}' (start {})", ps[k].sources.front(), ps[k].rule->take->start));
    }
    if (!alike)
      throw ValueError(fmt::format("{}: '{}' comes back from the parts its takes made, {} alike parts with starts "
                                   "0..{} and the same steps; the source has {}",
                                   map_name, path, first.rule->take->step, first.rule->take->step - 1,
                                   fmt::join(names, ", ")));
    MappedTensor merged = first;
    merged.sources.clear();
    for (const MappedTensor& p : ps) merged.sources.push_back(p.sources.front());
    merged.takes = true;
    out[slot.at(path)] = std::move(merged);
  }
  return out;
}

}  // namespace

MapPlan plan_key_map(const KeyMap& map, const State& source) {
  std::vector<Pattern> from, to;
  for (const KeyMapRule& r : map.rules) {
    from.push_back(regex_of(r.from));
    to.push_back(regex_of(r.to));
  }
  // The first rule whose pattern (one side) matches each source path, with its {i} and {e}; on
  // the `from` side, a first rule with a take is followed by every other take rule that matches.
  struct Match {
    size_t rule;
    int64_t layer, expert;  // -1: not in the pattern
  };
  // Matching `from` names, a rule takes only the layers in its range, numbered from its start.
  auto match_all = [&](const std::vector<Pattern>& patterns, bool from_side, std::vector<std::string>& unmatched) {
    std::multimap<std::string, Match, PathLess> out;
    for (const auto& entry : source) {
      const std::string& path = entry.first;
      bool found = false, takes = false;
      for (size_t r = 0; r < patterns.size() && (!found || takes); ++r) {
        if (found && !map.rules[r].take) continue;
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
          takes = !found && from_side && rule.take;
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
      const Shape split = split_shape(r, transposed(v.shape(), r.transpose), what);
      check_value_steps(r, split, v.dtype(), what);
      const Shape s = take_shape(r, split, what);
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
        const Shape whole = untake_shape(r, slice, what);
        check_value_steps(r, whole, v.dtype(), what);
        const Shape s = untransposed(merge_shape(r, whole, what), r.transpose);
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
        const Shape whole = untake_shape(r, v.shape(), what);
        if (r.transpose.size() && r.transpose.size() != merge_shape(r, whole, what).rank())
          throw ValueError(fmt::format("{}: transpose of {} axes does not fit", what, r.transpose.size()));
        check_value_steps(r, whole, v.dtype(), what);
        const Shape s = untransposed(merge_shape(r, whole, what), r.transpose);
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
    Shape s = take_shape(r, split_shape(r, transposed(first.shape(), r.transpose), "'" + target + "'"), "'" + target + "'");
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
  if (!fwd) plan.tensors = with_takes_together(std::move(plan.tensors), source, map.source);
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

// One source's part of the target, forward: transposed, split, interleaved, taken.
HostArray forward_layout(const MappedTensor& t, HostArray a) {
  const KeyMapRule& r = *t.rule;
  const Shape split_to = split_shape(r, transposed(a.shape(), r.transpose), t.path);
  HostArray split = reshaped(r.transpose.empty() ? std::move(a) : transpose(a, r.transpose), split_to);
  if (r.interleave) split = interleaved(split, static_cast<size_t>(*r.interleave), true);
  return r.take ? take_rows(split, *r.take) : split;
}

// Backward, from the source's slice (the source's rank, its unstacked axes of extent 1), or a
// take's parts' slices: put together, de-interleaved, merged, transposed back.
HostArray backward_layout(const MappedTensor& t, std::vector<HostArray> parts) {
  const KeyMapRule& r = *t.rule;
  for (HostArray& part : parts) {
    Shape s = part.shape();
    for (auto it = t.unstack.rbegin(); it != t.unstack.rend(); ++it) s = remove_axis(s, static_cast<size_t>(*it));
    part.reshape(s);
  }
  HostArray piece = t.takes ? untake_rows(parts, static_cast<size_t>(r.take->axis)) : std::move(parts.front());
  if (r.interleave) piece = interleaved(piece, static_cast<size_t>(*r.interleave), false);
  const Shape merged = merge_shape(r, piece.shape(), t.path);
  return transpose(reshaped(std::move(piece), merged), r.transpose.empty() ? r.transpose : inverse(r.transpose));
}

// The target's layout (transposed, split, interleaved, stacked; or the way back) of its sources.
HostArray apply_layout(const MappedTensor& t, const std::vector<const HostArray*>& sources) {
  const size_t item = item_size(t.dtype);
  if (t.forward) {
    auto one = [&](const HostArray& a) { return forward_layout(t, a); };
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
  std::vector<HostArray> parts;
  for (const HostArray* src : sources) {
    if (t.unstack.empty()) {
      parts.push_back(*src);
      continue;
    }
    const Box region = slice_box(src->shape(), t.unstack, t.index);
    HostArray slice(region.shape(), t.dtype);
    copy_region(src->bytes().data(), Box::full(src->shape()), slice.mutable_bytes().data(), region, region, item);
    parts.push_back(std::move(slice));
  }
  return backward_layout(t, std::move(parts));
}

void apply_scale(const MappedTensor& t, HostArray& out) {
  if (t.rule->scale) scale_values(out, t.forward ? *t.rule->scale : 1.0 / *t.rule->scale, t.path);
}

}  // namespace

HostArray apply_mapped(const MappedTensor& t, const std::vector<const HostArray*>& sources) {
  HostArray out = apply_layout(t, sources);
  apply_scale(t, out);
  return out;
}

std::optional<std::vector<int64_t>> map_permutation(const MappedTensor& t, const Shape& source_shape) {
  const KeyMapRule& r = *t.rule;
  if (r.split_axis || r.interleave || r.take || r.scale || t.takes) return std::nullopt;
  const size_t rank = source_shape.rank() - (t.forward ? 0 : t.unstack.size());
  if (r.transpose.empty()) {
    std::vector<int64_t> identity(rank);
    std::iota(identity.begin(), identity.end(), 0);
    return identity;
  }
  return t.forward ? r.transpose : inverse(r.transpose);
}

namespace {

// The axes of a rank-`rank` array that are not in `skip` (ascending), in order.
std::vector<size_t> other_axes(size_t rank, const std::vector<int64_t>& skip) {
  std::vector<size_t> out;
  for (size_t a = 0; a < rank; ++a)
    if (std::find(skip.begin(), skip.end(), static_cast<int64_t>(a)) == skip.end()) out.push_back(a);
  return out;
}

// `piece` cut into slabs of at most `max_bytes` along one axis, for steps that only permute
// (`perm` takes the part, its unstacked axes left out, to the target piece, its stacked axes left
// out): the source's first such axis (reads in one run each) or the target's (writes in one run).
std::vector<MapPiece> slabs_of(const MappedTensor& t, const MapPiece& piece, const std::vector<int64_t>& perm,
                               int64_t max_bytes, bool source_slabs) {
  const Box& read = piece.reads.front().box;
  const std::vector<size_t> part_axes = other_axes(read.rank(), t.forward ? std::vector<int64_t>{} : t.unstack);
  const std::vector<size_t> piece_axes = other_axes(piece.target_box.rank(), t.forward ? t.stack : std::vector<int64_t>{});
  if (part_axes.empty()) return {piece};
  // The cut axis: p of the part (without unstacked axes), q of the target piece, perm[q] == p.
  size_t q = 0;
  if (source_slabs) q = static_cast<size_t>(std::find(perm.begin(), perm.end(), 0) - perm.begin());
  const auto p = static_cast<size_t>(perm[q]);
  const size_t from_axis = part_axes[p], to_axis = piece_axes[q];
  const int64_t extent = read.extent(from_axis);
  const int64_t bytes = read.volume() * static_cast<int64_t>(item_size(t.dtype));
  if (bytes <= max_bytes || extent <= 1) return {piece};
  const int64_t rows = std::max<int64_t>(1, max_bytes / std::max<int64_t>(bytes / extent, 1));
  std::vector<MapPiece> out;
  for (int64_t a = 0; a < extent; a += rows) {
    const int64_t b = std::min(extent, a + rows);
    std::vector<int64_t> from_start(read.starts().begin(), read.starts().end()), from_stop(read.stops().begin(), read.stops().end());
    from_start[from_axis] = read.start(from_axis) + a;
    from_stop[from_axis] = read.start(from_axis) + b;
    const Box& target = piece.target_box;
    std::vector<int64_t> to_start(target.starts().begin(), target.starts().end()), to_stop(target.stops().begin(), target.stops().end());
    to_start[to_axis] = target.start(to_axis) + a;
    to_stop[to_axis] = target.start(to_axis) + b;
    MapPiece slab{{}, Box(std::move(to_start), std::move(to_stop))};
    for (const MapPiece::Read& r : piece.reads) slab.reads.push_back({r.source, Box(from_start, from_stop)});
    out.push_back(std::move(slab));
  }
  return out;
}

}  // namespace

std::vector<MapPiece> map_pieces(const MappedTensor& t, const Shape& source_shape, int64_t max_target_bytes,
                                 bool source_slabs) {
  const Box whole = Box::full(source_shape);
  std::vector<MapPiece> out;
  if (t.forward && !t.stack.empty()) {
    std::vector<int64_t> counts;
    for (int64_t axis : t.stack) counts.push_back(t.shape[static_cast<size_t>(axis)]);
    for (size_t i = 0; i < t.sources.size(); ++i)
      out.push_back({{{i, whole}}, slice_box(t.shape, t.stack, unravel(static_cast<int64_t>(i), counts))});
  } else {
    MapPiece piece{{}, Box::full(t.shape)};
    const Box box = !t.forward && !t.unstack.empty() ? slice_box(source_shape, t.unstack, t.index) : whole;
    for (size_t i = 0; i < t.sources.size(); ++i) piece.reads.push_back({i, box});
    out.push_back(std::move(piece));
  }
  const std::optional<std::vector<int64_t>> perm = map_permutation(t, source_shape);
  if (!perm || max_target_bytes <= 0) return out;
  std::vector<MapPiece> cut;
  for (const MapPiece& piece : out)
    for (MapPiece& slab : slabs_of(t, piece, *perm, max_target_bytes, source_slabs)) cut.push_back(std::move(slab));
  return cut;
}

HostArray apply_piece(const MappedTensor& t, const MapPiece& piece, std::vector<HostArray> parts) {
  HostArray out;
  if (t.forward) {
    out = forward_layout(t, std::move(parts.front()));
    out.reshape(piece.target_box.shape());  // the stacked axes, of extent 1, change no byte's place
  } else {
    out = backward_layout(t, std::move(parts));
  }
  apply_scale(t, out);
  return out;
}

}  // namespace tessel
