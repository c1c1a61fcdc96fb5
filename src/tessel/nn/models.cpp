#include "tessel/nn/models.h"

#include <cmath>
#include <functional>

#include "tessel/core/error.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {
namespace {

const Tensor& at(const Params& p, const std::string& path) {
  auto it = p.find(path);
  if (it == p.end()) throw ValueError("the model's parameters have no '" + path + "' (a different model's state?)");
  return it->second;
}

// One layer's parameter: a slice of the stacked parameter, or the layer's own.
using LayerParam = std::function<Tensor(const std::string& name)>;

LayerParam layer(const TransformerConfig& c, const Params& p, int64_t i) {
  return [&c, &p, i](const std::string& name) {
    if (!c.scan_layers) return at(p, "decoder/layers/" + std::to_string(i) + "/" + name);
    const Tensor& stacked = at(p, "decoder/layers/" + name);
    const size_t dim = std::min(static_cast<size_t>(c.scan_axis), stacked.rank() - 1);
    return ops::index(stacked, dim, i);
  };
}

Tensor attention(const TransformerConfig& c, const LayerParam& w, const Tensor& x) {
  const int64_t b = x.shape()[0], s = x.shape()[1], e = x.shape()[2];
  const int64_t h = c.heads, kv = c.resolved_kv_heads(), d = c.resolved_head_dim(), g = h / kv;
  auto project = [&](const std::string& name, int64_t n) {
    return ops::reshape(ops::dot(x, ops::reshape(w(name), Shape{e, n * d})), Shape{b, s, n, d});
  };
  Tensor q = project("self_attention/query/kernel", h);
  Tensor k = project("self_attention/key/kernel", kv);
  const Tensor v = project("self_attention/value/kernel", kv);
  if (c.qk_norm) {
    q = rms_norm(q, w("self_attention/query_norm/scale"));
    k = rms_norm(k, w("self_attention/key_norm/scale"));
  }
  q = ops::scale(ops::rope(q, 1), 1.0 / std::sqrt(static_cast<double>(d)));
  k = ops::rope(k, 1);
  // Query heads grouped by the key/value head they share: [b, kv, g * s, d].
  const Tensor qg =
      ops::reshape(ops::transpose(ops::reshape(q, Shape{b, s, kv, g, d}), {0, 2, 3, 1, 4}), Shape{b, kv, g * s, d});
  const Tensor kt = ops::transpose(k, {0, 2, 1, 3}), vt = ops::transpose(v, {0, 2, 1, 3});
  const Tensor scores = ops::reshape(ops::matmul(qg, kt, false, true), Shape{b, kv, g, s, s});
  const Tensor probs = ops::reshape(ops::softmax(ops::causal_mask(scores), 4), Shape{b, kv, g * s, s});
  const Tensor context = ops::matmul(probs, vt);
  const Tensor merged =
      ops::reshape(ops::transpose(ops::reshape(context, Shape{b, kv, g, s, d}), {0, 3, 1, 2, 4}), Shape{b, s, h * d});
  return ops::dot(merged, ops::reshape(w("self_attention/out/kernel"), Shape{h * d, e}));
}

Tensor mlp(const TransformerConfig& c, const LayerParam& w, const Tensor& x) {
  const Tensor hidden = c.gated_mlp ? ops::mul(ops::silu(ops::dot(x, w("mlp/wi_0/kernel"))), ops::dot(x, w("mlp/wi_1/kernel")))
                                    : ops::gelu(ops::dot(x, w("mlp/wi/kernel")));
  return ops::dot(hidden, w("mlp/wo/kernel"));
}

}  // namespace

Params tensors(const State& state) {
  Params out;
  for (const auto& [path, v] : state) {
    if (!v.sharding()) throw ValueError("'" + path + "' has no sharding yet (eval_shape or init with a mesh first)");
    out.emplace(path, v.is_abstract() ? Tensor::abstract(v.shape(), v.dtype(), *v.sharding()) : Tensor(v.array(path)));
  }
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& scale, double eps) { return ops::rms_norm(x, scale, eps); }

Tensor dot_relu_dot(const Params& p, const Tensor& x) {
  return ops::dot(ops::relu(ops::dot(x, at(p, "dot1/kernel"))), at(p, "w2"));
}

Tensor transformer_logits(const TransformerConfig& c, const Params& p, const Tensor& tokens) {
  if (tokens.rank() != 2) throw ValueError("transformer: tokens must be [batch, seq], got " + tokens.to_string());
  const Tensor& embedding = at(p, "token_embedder/embedding");
  Tensor x = ops::take(embedding, tokens);
  for (int64_t i = 0; i < c.layers; ++i) {
    const LayerParam w = layer(c, p, i);
    x = ops::add(x, attention(c, w, rms_norm(x, w("pre_self_attention_layer_norm/scale"))));
    x = ops::add(x, mlp(c, w, rms_norm(x, w("post_self_attention_layer_norm/scale"))));
  }
  x = rms_norm(x, at(p, "decoder/decoder_norm/scale"));
  return c.tied_embedding ? ops::dot_nt(x, embedding) : ops::dot(x, at(p, "decoder/logits_dense/kernel"));
}

}  // namespace tessel::nn
