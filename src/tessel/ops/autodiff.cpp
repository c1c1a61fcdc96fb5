#include "tessel/ops/autodiff.h"

#include <cstring>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/ops.h"

namespace tessel::ops {
namespace {

thread_local bool g_recording = true;

struct NoRecord {
  bool saved = g_recording;
  NoRecord() { g_recording = false; }
  ~NoRecord() { g_recording = saved; }
};

// A tensor of `shape` filled with `value`, replicated on `sharding`'s mesh.
Tensor filled(const Tensor& like, const Shape& shape, const NamedSharding& sharding, double value) {
  if (like.is_abstract()) return Tensor::abstract(shape, like.dtype(), sharding);
  const DType dtype = like.dtype();
  return Tensor(detail::compute_shards(like.shards().runtime(), shape, dtype, sharding,
                                       [&](int64_t, const Box& box, std::byte* out) {
                                         for (int64_t i = 0, n = box.volume(); i < n; ++i) {
                                           if (dtype == DType::kF32) {
                                             reinterpret_cast<float*>(out)[i] = static_cast<float>(value);
                                           } else {
                                             reinterpret_cast<double*>(out)[i] = value;
                                           }
                                         }
                                       }));
}

struct Piece {
  Shape shape;  // of the indexed tensor
  NamedSharding sharding;  // of the indexed tensor
  size_t dim;
  int64_t index;
  Tensor grad;
};
using Pieces = std::vector<Piece>;

// The gradient of a tensor from the gradients of its index()ed slices, in arrival order: one
// index_put_all when they agree in dimension, dtype and sharding (a scan's layers do), else each
// placed and added as index's own backward would.
Tensor place(const Pieces& list) {
  const Piece& first = list.front();
  bool together = true;
  for (const Piece& p : list)
    together = together && p.dim == first.dim && p.grad.dtype() == first.grad.dtype() &&
               p.grad.sharding() == first.grad.sharding() && p.grad.partial() == first.grad.partial();
  if (together) {
    // Partial sums (a layer's weight gradient on each device of data parallelism) are reduced
    // piece by piece, into the indexed tensor's split less `dim`, before they are placed: placed
    // first, every device's own partial block was copied into the stacked gradient (8 copies of
    // each layer's on data=8) and then reduced. Each element's sum is the same either way.
    std::optional<NamedSharding> target;
    if (first.grad.is_partial() && first.sharding.mesh() == first.grad.mesh()) {
      detail::Dims d = detail::dims_of(first.sharding, first.shape.rank());
      d.erase(d.begin() + static_cast<std::ptrdiff_t>(first.dim));
      target = detail::with_dims(first.sharding.mesh(), d);
    }
    std::vector<std::pair<int64_t, Tensor>> at;
    for (const Piece& p : list) at.emplace_back(p.index, target ? detail::reduce_raw(p.grad, &*target) : p.grad);
    return index_put_all(first.shape, first.dim, at);
  }
  Tensor sum;
  for (const Piece& p : list) {
    Tensor one = index_put(p.grad, p.shape, p.dim, p.index);
    sum = sum.defined() ? add(sum, one) : one;
  }
  return sum;
}

}  // namespace

bool detail::recording() { return g_recording; }

Tensor requires_grad(const Tensor& x) {
  auto node = std::make_shared<detail::Node>();
  node->leaf = true;
  return x.with_node(std::move(node));
}

std::vector<Tensor> grad(const Tensor& loss, const std::vector<Tensor>& wrt) {
  if (loss.rank() != 0) throw ValueError("grad needs a scalar loss, got " + loss.to_string());
  // Reverse topological order of the nodes the loss depends on.
  std::vector<detail::Node*> order;
  std::unordered_set<detail::Node*> seen;
  std::vector<std::pair<detail::Node*, size_t>> stack;
  if (loss.node()) {
    stack.push_back({loss.node().get(), 0});
    seen.insert(loss.node().get());
  }
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      detail::Node* child = node->inputs[next++].node().get();
      if (child && seen.insert(child).second) stack.push_back({child, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  NoRecord guard;
  std::unordered_map<detail::Node*, Tensor> grads;
  // Gradients of index() slices, placed together once every consumer of the input has given its.
  std::unordered_map<detail::Node*, Pieces> pieces;
  auto settle = [&](detail::Node* node) {
    auto p = pieces.find(node);
    if (p == pieces.end()) return;
    Tensor placed = place(p->second);
    pieces.erase(p);
    auto [slot, fresh] = grads.emplace(node, placed);
    if (!fresh) slot->second = add(slot->second, placed);
  };
  // A folding backward takes each input's gradient so far out of `grads`; those it did not fold
  // go back, to be summed with its result as any other backward's.
  auto fold = [&](detail::Node* node, const Tensor& g) {
    const size_t n = node->inputs.size();
    std::vector<Tensor> pending(n);
    std::vector<detail::Node*> taken(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      detail::Node* child = node->inputs[i].node().get();
      auto slot = child ? grads.find(child) : grads.end();
      if (slot == grads.end()) continue;  // none yet, or taken for an earlier input
      pending[i] = std::move(slot->second);
      taken[i] = child;
      grads.erase(slot);
    }
    std::vector<Tensor> out = node->backward_folding(g, pending);
    for (size_t i = 0; i < n; ++i)
      if (taken[i] && pending[i].defined()) grads.emplace(taken[i], std::move(pending[i]));
    return out;
  };
  if (loss.node()) grads[loss.node().get()] = filled(loss, loss.shape(), NamedSharding(loss.mesh(), {}), 1.0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    detail::Node* node = *it;
    settle(node);
    auto g = grads.find(node);
    if (g == grads.end() || node->leaf || (!node->backward && !node->backward_folding)) continue;
    if (node->slice) {
      const Tensor& x = node->inputs.front();
      if (x.node()) pieces[x.node().get()].push_back({x.shape(), x.sharding(), node->slice->dim, node->slice->index, g->second});
      continue;
    }
    const std::vector<Tensor> inputs_grads = node->backward ? node->backward(g->second) : fold(node, g->second);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      detail::Node* child = node->inputs[i].node().get();
      if (!child || !inputs_grads[i].defined()) continue;
      auto [slot, fresh] = grads.emplace(child, inputs_grads[i]);
      if (!fresh) slot->second = add(slot->second, inputs_grads[i]);
    }
  }
  std::vector<Tensor> out;
  for (const Tensor& x : wrt) {
    if (x.node()) settle(x.node().get());
    auto g = x.node() ? grads.find(x.node().get()) : grads.end();
    if (g == grads.end()) {
      out.push_back(filled(loss, x.shape(), x.sharding(), 0.0));
    } else {
      out.push_back(reshard(g->second, x.sharding()));
    }
  }
  return out;
}

}  // namespace tessel::ops
