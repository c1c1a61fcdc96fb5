// MaxText's RoutedMoE forward pass (layers/moe.py) on tessel's SPMD ops.
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/models/detail/maxtext_layers.h"
#include "tessel/ops/moe.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {
namespace {

Tensor score(const std::string& func, const Tensor& logits) {
  if (func.empty()) return logits;
  if (func == "sigmoid") return ops::sigmoid(logits);
  if (func == "softmax") return ops::softmax(logits, logits.rank() - 1);
  throw ValueError("routed_score_func: tessel's forward pass has '', sigmoid and softmax, not '" + func + "'");
}

// DeepSeek's group-limited choice (moe.py, expert_group_mask): the scores of experts outside the
// topk_routing_group groups with the highest sums of their top-2 scores, pushed far below the rest.
// Only the choice depends on it: no gradient.
Tensor group_limited(const MaxTextConfig& c, const Tensor& scores_in) {
  const Tensor scores = ops::stop_gradient(scores_in);
  const int64_t b = scores.shape()[0], s = scores.shape()[1], n = c.num_experts, groups = c.n_routing_groups;
  if (groups < 1 || n % groups != 0 || n / groups < 2 || c.topk_routing_group < 1 || c.topk_routing_group > groups)
    throw ValueError(fmt::format("n_routing_groups = {} and topk_routing_group = {} do not split {} experts into "
                                 "groups of at least 2 and choose among them", groups, c.topk_routing_group, n));
  const Tensor grouped = ops::reshape(scores, Shape{b, s, groups, n / groups});
  const Tensor group_scores = ops::sum(ops::top_k(grouped, 2).values, 3);                     // [b, s, groups]
  const Tensor chosen = ops::top_k(group_scores, c.topk_routing_group).indices;
  const Tensor mask = ops::choice_counts(chosen, group_scores);                                // 1: chosen group
  const Tensor expert_mask =
      ops::reshape(ops::broadcast_like(ops::reshape(mask, Shape{b, s, groups, 1}), grouped), Shape{b, s, n});
  // (mask - 1) * big: 0 inside the chosen groups, far below any score outside (as -inf for top_k).
  return ops::add(scores, ops::scale(ops::add_scalar(expert_mask, -1.0), 1e30));
}

// MaxText's get_topk: the chosen experts and their weights.
ops::TopK choose(const MaxTextConfig& c, const Tensor& gate_logits, const Tensor& pre_bias) {
  const int64_t k = c.num_experts_per_tok;
  const size_t last = gate_logits.rank() - 1;
  ops::TopK top;
  if (c.deepseek_routing()) {
    // Chosen by the biased scores (within the best groups), weighted by the unbiased ones.
    const Tensor choice = c.n_routing_groups == -1 ? ops::stop_gradient(gate_logits) : group_limited(c, gate_logits);
    top.indices = ops::top_k(choice, k).indices;
    top.values = ops::take_along_last(pre_bias, top.indices);
  } else {
    top = ops::top_k(gate_logits, k);
  }
  if (c.family == MaxTextFamily::kDeepseek) {
    if (c.routed_score_func == "sigmoid")
      top.values = ops::div(top.values, ops::add_scalar(ops::sum(top.values, last, true), 1e-20));
    top.values = ops::scale(top.values, c.routed_scaling_factor);
  } else {
    top.values = ops::softmax(top.values, last);
    if (c.norm_topk_prob) top.values = ops::div(top.values, ops::sum(top.values, last, true));
  }
  return top;
}

// MaxText's capacity per batch row: ceil(seq * k / experts) * capacity_factor, at least the factor.
int64_t capacity_of(const MaxTextConfig& c, int64_t seq) {
  if (c.capacity_factor <= 0) return 0;  // dropless
  const double tokens = static_cast<double>(seq * c.num_experts_per_tok);
  const double per_expert = std::ceil(tokens / static_cast<double>(c.num_experts));
  return static_cast<int64_t>(std::max(per_expert * c.capacity_factor, c.capacity_factor));
}

// The experts' gated MLP on their buffers [experts, rows, emb]; wi_0 is w("wi_0"), taken once.
Tensor experts_forward(const MaxTextConfig& c, const Weights& w, const Tensor& wi_0, const Tensor& rows) {
  if (c.mlp_activations.size() != 2 || c.mlp_activations[1] != "linear")
    throw ValueError("mlp_activations: routed experts take [activation, \"linear\"]");
  auto biased = [&](Tensor y, const std::string& name) {
    if (!c.mlp_bias) return y;
    const Tensor bias = w(name + "_bias");
    return ops::add(y, ops::reshape(bias, Shape{bias.shape()[0], 1, bias.shape()[1]}));
  };
  Tensor gate = biased(ops::matmul(rows, wi_0), "wi_0");
  Tensor up = biased(ops::matmul(rows, w("wi_1")), "wi_1");
  // apply_ffn_activation: gpt-oss and DeepSeek V4 clip both projections at the limit first.
  const double limit = c.mlp_activations_limit;
  const bool gpt_oss = c.family == MaxTextFamily::kGptOss;
  if (limit > 0 && (gpt_oss || c.family == MaxTextFamily::kDeepseek)) {
    gate = ops::clip(gate, -std::numeric_limits<double>::infinity(), limit);
    up = ops::clip(up, -limit, limit);
  }
  const std::string& act = c.mlp_activations[0];
  auto activation = [&](const Tensor& t) {
    if (act == "silu") return ops::silu(t);
    if (act == "gelu") return ops::gelu(t);
    if (act == "relu") return ops::relu(t);
    if (act == "sigmoid") return ops::sigmoid(t);
    if (act == "linear") return t;
    throw ValueError("mlp_activations: tessel's forward pass has silu, gelu, relu, sigmoid and linear, not '" + act + "'");
  };
  // gpt-oss's GLU: gate * act(1.702 gate) * (up + 1).
  const Tensor hidden = gpt_oss ? ops::mul(ops::mul(gate, activation(ops::scale(gate, 1.702))), ops::add_scalar(up, 1.0))
                                : ops::mul(activation(gate), up);
  return biased(ops::matmul(hidden, w("wo")), "wo");
}

}  // namespace

Tensor routed_moe_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, std::vector<Tensor>& aux) {
  const int64_t b = x.shape()[0], s = x.shape()[1], e = x.shape()[2], n = c.num_experts;
  Tensor gate_logits = score(c.routed_score_func, ops::dot(x, w("gate/kernel")));
  const Tensor pre_bias = gate_logits;
  if (c.routed_bias) gate_logits = ops::add(gate_logits, w("gate/bias"));
  const ops::TopK top = choose(c, gate_logits, pre_bias);
  if (c.load_balance_loss_weight > 0) {
    // Switch Transformer's loss per sequence: token density times router probability per expert.
    const Tensor probs = ops::softmax(gate_logits, 2);
    const Tensor density = ops::mean(ops::choice_counts(top.indices, probs), 1);
    const Tensor density_prob = ops::mean(probs, 1);
    aux.push_back(ops::scale(ops::mean(ops::mul(density, density_prob)),
                             static_cast<double>(n * n) * c.load_balance_loss_weight));
  }
  const ops::Routing routing = ops::route(top.indices, n, capacity_of(c, s));
  const Tensor wi_0 = w("wi_0");
  Tensor buffer = ops::to_experts(ops::moe_dispatch(x, routing), wi_0);
  const int64_t cap = routing.capacity;
  const Tensor rows = ops::reshape(buffer, Shape{n, b * cap, e});
  const Tensor out = ops::reshape(experts_forward(c, w, wi_0, rows), Shape{n, b, cap, e});
  return ops::moe_combine(ops::from_experts(out, routing), top.values, routing);
}

}  // namespace tessel::maxtext
