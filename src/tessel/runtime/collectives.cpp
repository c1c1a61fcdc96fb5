#include "tessel/runtime/collectives.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/detail/kernels.h"

namespace tessel {
namespace {

// Throws unless `axes` is a non-empty list of distinct axes of the array's mesh.
void check_axes(const Array& x, const std::vector<std::string>& axes, std::string_view op) {
  if (axes.empty()) throw ValueError(fmt::format("{}: no mesh axes given", op));
  for (size_t i = 0; i < axes.size(); ++i) {
    if (!x.mesh().has_axis(axes[i]))
      throw ValueError(fmt::format("{} over '{}': {} has no such axis (axes: {})", op, axes[i],
                                   x.mesh().to_string(), fmt::join(x.mesh().axis_names(), ", ")));
    if (std::find(axes.begin(), axes.begin() + static_cast<ptrdiff_t>(i), axes[i]) !=
        axes.begin() + static_cast<ptrdiff_t>(i))
      throw ValueError(fmt::format("{}: axis '{}' is listed twice", op, axes[i]));
  }
}

std::string axes_text(const std::vector<std::string>& axes) {
  return fmt::format("'{}'", fmt::join(axes, "', '"));
}

// The dimension whose spec entry uses `axis`, or -1.
int64_t dim_using(const PartitionSpec& spec, const std::string& axis) {
  for (size_t d = 0; d < spec.size(); ++d)
    if (std::find(spec[d].begin(), spec[d].end(), axis) != spec[d].end()) return static_cast<int64_t>(d);
  return -1;
}

void check_dim(const Array& x, size_t dim, std::string_view op, std::string_view which) {
  if (dim >= x.shape().rank())
    throw ValueError(fmt::format("{}: {} {} is out of range for {} (rank {})", op, which, dim,
                                 x.display_name(), x.shape().rank()));
}

void check_unsharded(const Array& x, const std::vector<std::string>& axes, std::string_view op) {
  for (const std::string& a : axes)
    if (int64_t d = dim_using(x.sharding().spec(), a); d >= 0)
      throw ValueError(fmt::format(
          "{} over '{}': {} is sharded over '{}' in dimension {} ({}), so the devices of a group "
          "hold different blocks; gather it first or reduce over other axes",
          op, a, x.display_name(), a, d, x.sharding().spec().to_string()));
}

// Removes `axes` from dimension `dim`, where they must be the minor (last) entries.
void remove_minor_axes(std::vector<DimSharding>& dims, size_t dim,
                       const std::vector<std::string>& axes, const Array& x, std::string_view op) {
  DimSharding& entry = dims[dim];
  size_t k = 0;
  for (const std::string& a : axes)
    if (std::find(entry.begin(), entry.end(), a) != entry.end()) ++k;
  for (size_t i = entry.size() - k; i < entry.size(); ++i)
    if (std::find(axes.begin(), axes.end(), entry[i]) == axes.end())
      throw ValueError(fmt::format(
          "{} over {}: dimension {} of {} is split over ({}), where '{}' is more minor than the "
          "axes to move; the pieces would not form blocks (use reshard)",
          op, axes_text(axes), dim, x.display_name(), fmt::join(entry, ", "), entry[i]));
  entry.resize(entry.size() - k);
}

NamedSharding with_dims(const Array& x, std::vector<DimSharding> dims) {
  while (!dims.empty() && dims.back().empty()) dims.pop_back();
  return NamedSharding(x.mesh(), PartitionSpec(std::move(dims)));
}

// The result of a non-reducing collective: every device's target block is assembled from the
// source shards of its group. Throws if a block needs bytes from outside the group (uneven
// sizes whose blocks do not nest).
Array group_exchange(const Array& x, const NamedSharding& target,
                     const std::vector<std::string>& axes, std::string_view op) {
  detail::ArrayBuilder b(x.runtime(), x.shape(), x.dtype(), target, x.label());
  const Mesh& mesh = x.mesh();
  b.share_unchanged(x);
  // Members of a group that receive the same box receive the same bytes: stored once. (Not across
  // groups: a partial sum over other axes differs from group to group.)
  for (const auto& group : mesh.subgroups(axes)) b.share_within(group);
  b.allocate_all();
  std::vector<CopyTask> tasks;
  for (const auto& group : mesh.subgroups(axes)) {
    for (int64_t d : group) {
      auto i = static_cast<size_t>(mesh.position(d));
      const Box& out = b.shard(i).box;
      int64_t covered = 0;
      for (int64_t m : group) {
        const Shard& s = x.shard(m);
        Box region = out.intersect(s.box);
        covered += region.volume();
        if (!b.is_shared(i) && !region.empty())
          tasks.push_back(CopyTask{m, s.buffer.data(), s.box, d, b.data(i), out, std::move(region), b.is_replica(i)});
      }
      if (covered != out.volume())
        throw ValueError(fmt::format(
            "{} over {}: the blocks of {} {} do not nest evenly (device {} needs {} from outside "
            "its group); make the sharded dimensions divisible or use reshard",
            op, axes_text(axes), x.display_name(), x.type_string(), d, out.to_string()));
    }
  }
  x.runtime().communicator().copy(tasks, x.dtype());
  return std::move(b).finish();
}

int64_t group_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  int64_t n = 1;
  for (const std::string& a : axes) n *= mesh.axis_size(a);
  return n;
}

// The same shards under another sharding with equal boxes (size-1 groups): no copy.
Array relabel(const Array& x, const NamedSharding& target) {
  detail::ArrayBuilder b(x.runtime(), x.shape(), x.dtype(), target, x.label());
  b.share_unchanged(x);
  return std::move(b).finish();
}

}  // namespace

Array all_gather(const Array& x, const std::vector<std::string>& axes) {
  constexpr std::string_view op = "all_gather";
  check_axes(x, axes, op);
  std::vector<DimSharding> dims = x.sharding().spec().dims();
  std::vector<size_t> touched;
  for (const std::string& a : axes) {
    int64_t d = dim_using(x.sharding().spec(), a);
    if (d < 0)
      throw ValueError(fmt::format("all_gather over '{}': {} is not sharded over it ({}); there is "
                                   "nothing to gather", a, x.display_name(),
                                   x.sharding().spec().to_string()));
    if (std::find(touched.begin(), touched.end(), d) == touched.end()) touched.push_back(static_cast<size_t>(d));
  }
  for (size_t d : touched) remove_minor_axes(dims, d, axes, x, op);
  return group_exchange(x, with_dims(x, std::move(dims)), axes, op);
}

Array all_to_all(const Array& x, const std::vector<std::string>& axes, size_t split_dim,
                 size_t concat_dim) {
  constexpr std::string_view op = "all_to_all";
  check_axes(x, axes, op);
  check_dim(x, split_dim, op, "split dimension");
  check_dim(x, concat_dim, op, "concat dimension");
  if (split_dim == concat_dim)
    throw ValueError(fmt::format("all_to_all: split and concat dimension are both {}", split_dim));
  std::vector<DimSharding> dims = x.sharding().spec().dims();
  dims.resize(std::max(dims.size(), std::max(split_dim, concat_dim) + 1));
  for (const std::string& a : axes)
    if (dim_using(x.sharding().spec(), a) != static_cast<int64_t>(concat_dim))
      throw ValueError(fmt::format("all_to_all over {}: '{}' must shard the concat dimension {} "
                                   "of {} ({})", axes_text(axes), a, concat_dim, x.display_name(),
                                   x.sharding().spec().to_string()));
  remove_minor_axes(dims, concat_dim, axes, x, op);
  dims[split_dim].insert(dims[split_dim].end(), axes.begin(), axes.end());
  return group_exchange(x, with_dims(x, std::move(dims)), axes, op);
}

Array reduce_scatter(const Array& x, const std::vector<std::string>& axes, size_t dim, Reduction op) {
  constexpr std::string_view what = "reduce_scatter";
  check_axes(x, axes, what);
  check_dim(x, dim, what, "dimension");
  check_unsharded(x, axes, what);
  detail::check_reduction(x.dtype(), op);
  std::vector<DimSharding> dims = x.sharding().spec().dims();
  dims.resize(std::max(dims.size(), dim + 1));
  dims[dim].insert(dims[dim].end(), axes.begin(), axes.end());
  NamedSharding target = with_dims(x, std::move(dims));
  if (group_size(x.mesh(), axes) == 1) return relabel(x, target);

  detail::ArrayBuilder b(x.runtime(), x.shape(), x.dtype(), target, x.label());
  b.allocate_all();
  const Mesh& mesh = x.mesh();
  std::vector<ReduceTask> tasks;
  for (const auto& group : mesh.subgroups(axes)) {
    std::vector<std::pair<int64_t, const std::byte*>> inputs;
    for (int64_t m : group) inputs.emplace_back(m, x.shard(m).buffer.data());
    for (int64_t d : group) {
      auto i = static_cast<size_t>(mesh.position(d));
      const Box& in = x.shard(d).box;
      const Box& out = b.shard(i).box;
      if (!in.contains(out))
        throw ValueError(fmt::format(
            "reduce_scatter over {}: dimension {} of {} {} does not split evenly (device {} "
            "would need {} outside its box {}); make it divisible or reshard",
            axes_text(axes), dim, x.display_name(), x.type_string(), d, out.to_string(), in.to_string()));
      if (!out.empty()) tasks.push_back(ReduceTask{inputs, in, {{d, b.data(i)}}, out, out});
    }
  }
  x.runtime().communicator().reduce(tasks, x.dtype(), op);
  return std::move(b).finish();
}

Array all_reduce(const Array& x, const std::vector<std::string>& axes, Reduction op) {
  constexpr std::string_view what = "all_reduce";
  check_axes(x, axes, what);
  check_unsharded(x, axes, what);
  detail::check_reduction(x.dtype(), op);
  if (group_size(x.mesh(), axes) == 1) return x;

  // Over a flat view of the block, member j reduces the j-th 1/n piece and sends it to the
  // others: every device receives 2 (n - 1) / n of the block, the lower bound, in one pass.
  // The members of a group hold one result: in this process they share its bytes.
  detail::ArrayBuilder b(x.runtime(), x.shape(), x.dtype(), x.sharding(), x.label());
  const Mesh& mesh = x.mesh();
  for (const auto& group : mesh.subgroups(axes)) b.share_within(group);
  b.allocate_all();
  std::vector<ReduceTask> tasks;
  for (const auto& group : mesh.subgroups(axes)) {
    const int64_t volume = x.shard(group.front()).box.volume();
    const auto n = static_cast<int64_t>(group.size());
    const Box flat({0}, {volume});
    std::vector<std::pair<int64_t, const std::byte*>> inputs;
    for (int64_t m : group) inputs.emplace_back(m, x.shard(m).buffer.data());
    for (int64_t j = 0; j < n; ++j) {
      const Box piece({volume * j / n}, {volume * (j + 1) / n});
      if (piece.empty()) continue;
      // The owner of piece j first, then the others in group order.
      std::vector<std::pair<int64_t, std::byte*>> outputs;
      for (int64_t k = 0; k < n; ++k) {
        int64_t member = group[static_cast<size_t>((j + k) % n)];
        outputs.emplace_back(member, b.data(static_cast<size_t>(mesh.position(member))));
      }
      tasks.push_back(ReduceTask{inputs, flat, std::move(outputs), flat, piece});
    }
  }
  x.runtime().communicator().reduce(tasks, x.dtype(), op);
  return std::move(b).finish();
}

Array ppermute(const Array& x, std::string_view axis, int64_t shift) {
  const std::string name(axis);
  check_axes(x, {name}, "ppermute");
  const Mesh& mesh = x.mesh();
  const int64_t n = mesh.axis_size(name);
  const int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  const size_t a = mesh.axis_index(name);
  detail::ArrayBuilder b(x.runtime(), x.shape(), x.dtype(), x.sharding(), x.label());
  b.allocate_all();
  std::vector<CopyTask> tasks;
  for (size_t i = 0; i < b.size(); ++i) {
    const int64_t d = b.shard(i).device;
    std::vector<int64_t> c = mesh.coords(d);
    c[a] = (c[a] - s + n) % n;
    const Shard& src = x.shard(mesh.device_at(c));
    if (src.box.shape() != b.shard(i).box.shape())
      throw ValueError(fmt::format(
          "ppermute over '{}': device {} would receive a {} shard from device {} but holds {}; "
          "the sharded dimensions of {} must divide evenly",
          name, d, src.box.shape().to_string(), src.device, b.shard(i).box.shape().to_string(),
          x.display_name()));
    // Both buffers have the same shape, so the copy runs in the sender's frame.
    tasks.push_back(CopyTask{src.device, src.buffer.data(), src.box, d, b.data(i), src.box, src.box});
  }
  x.runtime().communicator().copy(tasks, x.dtype());
  return std::move(b).finish();
}

}  // namespace tessel
