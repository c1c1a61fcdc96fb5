#include "tessel/ops/autodiff.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/node.h"
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
  if (loss.node()) grads[loss.node().get()] = filled(loss, loss.shape(), NamedSharding(loss.mesh(), {}), 1.0);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    detail::Node* node = *it;
    auto g = grads.find(node);
    if (g == grads.end() || node->leaf || !node->backward) continue;
    const std::vector<Tensor> inputs_grads = node->backward(g->second);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      detail::Node* child = node->inputs[i].node().get();
      if (!child || !inputs_grads[i].defined()) continue;
      auto [slot, fresh] = grads.emplace(child, inputs_grads[i]);
      if (!fresh) slot->second = add(slot->second, inputs_grads[i]);
    }
  }
  std::vector<Tensor> out;
  for (const Tensor& x : wrt) {
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
