// MaxText's RoutedMoE forward pass (layers/moe.py) on tessel's SPMD ops.
#include <cmath>

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

// MaxText's get_topk: the chosen experts and their weights.
ops::TopK choose(const MaxTextConfig& c, const Tensor& gate_logits, const Tensor& pre_bias) {
  const int64_t k = c.num_experts_per_tok;
  const size_t last = gate_logits.rank() - 1;
  ops::TopK top;
  if (c.deepseek_routing()) {
    if (c.n_routing_groups != -1)
      throw ValueError("n_routing_groups: tessel's forward pass has no group-limited routing yet");
    // Chosen by the biased scores, weighted by the unbiased ones.
    top.indices = ops::top_k(ops::stop_gradient(gate_logits), k).indices;
    top.values = ops::take_along_last(pre_bias, top.indices);
  } else {
    top = ops::top_k(gate_logits, k);
  }
  if (c.decoder_block == "deepseek") {
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
  if (c.mlp_activations_limit > 0)
    throw ValueError("mlp_activations_limit: tessel's forward pass has no clipped expert activations yet");
  auto biased = [&](Tensor y, const std::string& name) {
    if (!c.mlp_bias) return y;
    const Tensor bias = w(name + "_bias");
    return ops::add(y, ops::reshape(bias, Shape{bias.shape()[0], 1, bias.shape()[1]}));
  };
  Tensor gate = biased(ops::matmul(rows, wi_0), "wi_0");
  const Tensor up = biased(ops::matmul(rows, w("wi_1")), "wi_1");
  const std::string& act = c.mlp_activations[0];
  if (act == "silu") gate = ops::silu(gate);
  else if (act == "gelu") gate = ops::gelu(gate);
  else if (act == "relu") gate = ops::relu(gate);
  else if (act != "linear")
    throw ValueError("mlp_activations: tessel's forward pass has silu, gelu, relu and linear, not '" + act + "'");
  return biased(ops::matmul(ops::mul(gate, up), w("wo")), "wo");
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
