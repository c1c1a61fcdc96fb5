#include "tessel/ops/detail/propagation.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/ops/autodiff.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
#include "tessel/runtime/collectives.h"
#include "tessel/runtime/reshard.h"

namespace tessel::ops::detail {

Dims dims_of(const NamedSharding& s, size_t rank) {
  Dims d(rank);
  for (size_t i = 0; i < std::min(rank, s.spec().size()); ++i) d[i] = s.spec()[i];
  return d;
}

NamedSharding with_dims(const Mesh& mesh, const Dims& dims) { return NamedSharding(mesh, PartitionSpec(dims)); }

bool contains(const Axes& axes, const std::string& a) { return std::find(axes.begin(), axes.end(), a) != axes.end(); }
bool disjoint(const Axes& a, const Axes& b) {
  return std::none_of(a.begin(), a.end(), [&](const std::string& x) { return contains(b, x); });
}
Axes minus(const Axes& a, const Axes& b) {
  Axes out;
  for (const auto& x : a) {
    if (!contains(b, x)) out.push_back(x);
  }
  return out;
}
Axes all_axes(const Dims& dims) {
  Axes out;
  for (const auto& d : dims) out.insert(out.end(), d.begin(), d.end());
  return out;
}
Axes united(Axes a, const Axes& b) {
  for (const auto& x : b) {
    if (!contains(a, x)) a.push_back(x);
  }
  std::sort(a.begin(), a.end());
  return a;
}

// --- the graph
namespace {
// A graph node over `inputs`, or null when not recording or when no input is in the graph.
std::shared_ptr<detail::Node> node_over(std::vector<Tensor> inputs) {
  if (!recording()) return nullptr;
  if (std::none_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.node() != nullptr; })) return nullptr;
  auto node = std::make_shared<detail::Node>();
  node->inputs = std::move(inputs);
  return node;
}
}  // namespace

Tensor record(Tensor out, std::vector<Tensor> inputs, Backward backward) {
  auto node = node_over(std::move(inputs));
  if (!node) return out;
  node->backward = std::move(backward);
  return out.with_node(std::move(node));
}

Tensor record_folding(Tensor out, std::vector<Tensor> inputs, FoldingBackward backward) {
  auto node = node_over(std::move(inputs));
  if (!node) return out;
  node->backward_folding = std::move(backward);
  return out.with_node(std::move(node));
}

bool folds_into(const Tensor& pending, const Tensor& like, const NamedSharding& sharding) {
  return pending.defined() && !pending.is_partial() && !pending.is_abstract() && !like.is_abstract() &&
         pending.dtype() == like.dtype() && pending.sharding() == sharding;
}

namespace {
// A sum over the devices along axes of size 1 is each device's own term: those axes leave a
// partial sum whole (a batch split over data=1, fsdp=1 on a tensor=8 mesh contracts over them).
Axes summed_axes(const Mesh& mesh, Axes partial) {
  std::erase_if(partial, [&](const std::string& axis) { return mesh.axis_size(axis) == 1; });
  return partial;
}
}  // namespace

Tensor output(const Tensor& like, const Shape& shape, DType dtype, const NamedSharding& sharding, Axes partial,
              const BlockFn& fn) {
  partial = summed_axes(sharding.mesh(), std::move(partial));
  if (like.is_abstract()) return Tensor::abstract(shape, dtype, sharding, std::move(partial));
  // A result that is not a partial sum holds equal replicas: on one host each block is computed once.
  Array a = partial.empty() ? detail::compute_blocks_once(like.shards().runtime(), shape, dtype, sharding, fn)
                            : detail::compute_shards(like.shards().runtime(), shape, dtype, sharding, fn);
  return partial.empty() ? Tensor(std::move(a)) : Tensor::partial_sum(std::move(a), std::move(partial));
}

std::vector<Tensor> outputs(const Tensor& like, const std::vector<OutputLayout>& layouts, DType dtype,
                            const std::function<void(int64_t device, const std::vector<Box>& boxes,
                                                     const std::vector<std::byte*>& outs)>& fn) {
  std::vector<Tensor> out;
  if (like.is_abstract()) {
    for (const OutputLayout& l : layouts) out.push_back(Tensor::abstract(l.shape, dtype, l.sharding));
    return out;
  }
  for (Array& a : detail::compute_blocks_once(like.shards().runtime(), layouts, dtype, fn)) out.emplace_back(std::move(a));
  return out;
}

Tensor output_together(const Tensor& like, const Shape& shape, DType dtype, const NamedSharding& sharding,
                       Axes partial, const std::function<void(const std::vector<BlockTask>&)>& fn) {
  partial = summed_axes(sharding.mesh(), std::move(partial));
  if (like.is_abstract()) return Tensor::abstract(shape, dtype, sharding, std::move(partial));
  Array a = detail::compute_blocks_together(like.shards().runtime(), shape, dtype, sharding, partial.empty(), fn);
  return partial.empty() ? Tensor(std::move(a)) : Tensor::partial_sum(std::move(a), std::move(partial));
}

void check_float(const Tensor& t, const char* op) {
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kF64) {
    throw ValueError(std::string(op) + " takes f32 or f64 tensors, not " + t.to_string());
  }
}
// Two operands of one op: floating point, one dtype, one mesh.
void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  check_float(a, op);
  if (a.dtype() != b.dtype()) {
    throw ValueError(std::string(op) + ": dtypes differ: " + a.to_string() + " and " + b.to_string() + " (cast one)");
  }
  if (!(a.mesh() == b.mesh())) {
    throw ShardingError(std::string(op) + ": operands live on different meshes, " + a.mesh().to_string() + " and " +
                        b.mesh().to_string() + " (reshard one)");
  }
}

const std::byte* block(const Tensor& t, int64_t device) { return t.shards().shard(device).buffer.data(); }
const Box& block_box(const Tensor& t, int64_t device) { return t.shards().shard(device).box; }

// Redistribution of a non-partial tensor (no recording: callers record their own gradient).
Tensor reshard_raw(const Tensor& x, const NamedSharding& target) {
  if (x.sharding() == target) return x;
  if (x.is_abstract()) return Tensor::abstract(x.shape(), x.dtype(), target);
  return Tensor(tessel::reshard(x.array(), target));
}

int64_t blocks_of(const Mesh& mesh, const DimSharding& axes) {
  int64_t n = 1;
  for (const auto& a : axes) n *= mesh.axis_size(a);
  return n;
}

bool last_dim_whole(const Tensor& x) {
  return x.rank() == 0 || blocks_of(x.mesh(), dims_of(x.sharding(), x.rank())[x.rank() - 1]) == 1;
}

// Reduces the partial axes of x: reduce-scatter into `target`'s dimensions where the target
// splits a dimension further over a partial axis (and the split is even), all-reduce the rest.
Tensor reduce_raw(const Tensor& x, const NamedSharding* target) {
  if (!x.is_partial()) return x;
  Dims dims = dims_of(x.sharding(), x.rank());
  Axes left = x.partial();
  std::optional<Array> a;
  if (!x.is_abstract()) a = x.shards();
  if (target && target->mesh() == x.mesh()) {
    const Dims want = dims_of(*target, x.rank());
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t d = 0; d < dims.size(); ++d) {
        for (const auto& axis : Axes(left)) {
          DimSharding next = dims[d];
          next.push_back(axis);
          if (want[d].size() < next.size() || !std::equal(next.begin(), next.end(), want[d].begin())) continue;
          if (x.shape()[d] % blocks_of(x.mesh(), next) != 0) continue;
          if (a) a = reduce_scatter(*a, {axis}, d, Reduction::kSum);
          dims[d] = next;
          left = minus(left, {axis});
          progress = true;
        }
      }
    }
  }
  if (a && !left.empty()) a = all_reduce(*a, left, Reduction::kSum);
  if (a) return Tensor(std::move(*a));
  return Tensor::abstract(x.shape(), x.dtype(), with_dims(x.mesh(), dims));
}

// Bytes a device receives to turn its block of `from` into its block of `to` (0 when `to` only
// splits `from` further: a local slice).
int64_t redistribution_bytes(const Tensor& t, const Dims& from, const Dims& to) {
  bool local = true;
  for (size_t d = 0; d < from.size(); ++d) {
    if (to[d].size() < from[d].size() || !std::equal(from[d].begin(), from[d].end(), to[d].begin())) local = false;
  }
  if (local) return 0;
  int64_t n = static_cast<int64_t>(item_size(t.dtype()));
  for (size_t d = 0; d < to.size(); ++d) n *= (t.shape()[d] + blocks_of(t.mesh(), to[d]) - 1) / blocks_of(t.mesh(), to[d]);
  return n;
}

}  // namespace tessel::ops::detail
