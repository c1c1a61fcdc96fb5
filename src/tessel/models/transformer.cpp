#include "tessel/models/transformer.h"

#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "tessel/core/error.h"
#include "tessel/nn/attention.h"
#include "tessel/ops/ops.h"

namespace tessel {
namespace {

void check_positive(int64_t value, std::string_view model, std::string_view field) {
  if (value <= 0) throw ValueError(fmt::format("{}: {} must be positive, got {}", model, field, value));
}

// A parameter of one layer, declared without the layers dimension.
struct LayerParam {
  std::string path;
  std::vector<int64_t> shape;
  LogicalAxes logical;
  std::vector<size_t> in_axes, out_axes;
  Initializer init;
};

// Inserts the stacked "layers" dimension at `axis` (clamped to the rank, as a trailing axis for
// vectors), shifting fan axes and marking the new one as a batch axis.
ParamDecl stacked(const LayerParam& p, int64_t layers, int64_t axis, DType dtype) {
  const size_t at = std::min(static_cast<size_t>(axis), p.shape.size());
  std::vector<int64_t> shape = p.shape;
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(at), layers);
  LogicalAxes logical = p.logical;
  logical.insert(logical.begin() + static_cast<std::ptrdiff_t>(at), std::string("layers"));
  auto shift = [at](std::vector<size_t> axes) {
    for (size_t& a : axes) a += a >= at ? 1 : 0;
    return axes;
  };
  return ParamDecl{.name = p.path, .shape = Shape(std::move(shape)), .dtype = dtype, .init = p.init,
                   .partitioning = Partitioning::by_logical(std::move(logical)),
                   .fans = {.in_axes = shift(p.in_axes), .out_axes = shift(p.out_axes), .batch_axes = {at}}};
}

ParamDecl single(const LayerParam& p, DType dtype) {
  return ParamDecl{.name = p.path, .shape = Shape(p.shape), .dtype = dtype, .init = p.init,
                   .partitioning = Partitioning::by_logical(p.logical), .fans = {p.in_axes, p.out_axes, {}}};
}

std::vector<LayerParam> layer_params(const TransformerConfig& c) {
  const int64_t e = c.embed, h = c.heads, kv = c.resolved_kv_heads(), d = c.resolved_head_dim();
  auto norm = [&](std::string path, int64_t n) {
    return LayerParam{std::move(path), {n}, {std::string("norm")}, {}, {}, c.norm_init};
  };
  std::vector<LayerParam> out;
  out.push_back(norm("pre_self_attention_layer_norm/scale", e));
  out.push_back({"self_attention/query/kernel", {e, h, d}, {"embed", "q_heads", "kv"}, {0}, {1, 2}, c.kernel_init});
  out.push_back({"self_attention/key/kernel", {e, kv, d}, {"embed", "kv_heads", "kv"}, {0}, {1, 2}, c.kernel_init});
  out.push_back({"self_attention/value/kernel", {e, kv, d}, {"embed", "kv_heads", "kv"}, {0}, {1, 2}, c.kernel_init});
  out.push_back({"self_attention/out/kernel", {h, d, e}, {"heads", "kv", "embed"}, {0, 1}, {2}, c.kernel_init});
  if (c.qk_norm) {
    out.push_back(norm("self_attention/query_norm/scale", d));
    out.push_back(norm("self_attention/key_norm/scale", d));
  }
  out.push_back(norm("post_self_attention_layer_norm/scale", e));
  if (c.gated_mlp) {
    out.push_back({"mlp/wi_0/kernel", {e, c.mlp}, {"embed", "mlp"}, {0}, {1}, c.kernel_init});
    out.push_back({"mlp/wi_1/kernel", {e, c.mlp}, {"embed", "mlp"}, {0}, {1}, c.kernel_init});
  } else {
    out.push_back({"mlp/wi/kernel", {e, c.mlp}, {"embed", "mlp"}, {0}, {1}, c.kernel_init});
  }
  out.push_back({"mlp/wo/kernel", {c.mlp, e}, {"mlp", "embed"}, {0}, {1}, c.kernel_init});
  return out;
}

}  // namespace

void validate(const TransformerConfig& c) {
  constexpr std::string_view m = "transformer";
  check_positive(c.vocab, m, "vocab");
  check_positive(c.embed, m, "embed");
  check_positive(c.layers, m, "layers");
  check_positive(c.heads, m, "heads");
  check_positive(c.mlp, m, "mlp");
  if (c.kv_heads != 0) check_positive(c.kv_heads, m, "kv_heads");
  if (c.head_dim != 0) check_positive(c.head_dim, m, "head_dim");
  if (c.head_dim == 0 && c.embed % c.heads != 0)
    throw ValueError(fmt::format("transformer: heads ({}) must divide embed ({}) when head_dim is not given "
                                 "(head_dim = embed / heads)", c.heads, c.embed));
  if (c.heads % c.resolved_kv_heads() != 0)
    throw ValueError(fmt::format("transformer: kv_heads ({}) must divide heads ({})", c.resolved_kv_heads(), c.heads));
  // Unstacked layers are one Module each; past this many, stacking is the only sensible layout.
  if (!c.scan_layers && c.layers > 10000)
    throw ValueError(fmt::format("transformer: {} unstacked layers; at most 10000 without scan_layers "
                                 "(use scan_layers: true)", c.layers));
  if (c.scan_axis < 0 || c.scan_axis > 3)
    throw ValueError(fmt::format("transformer: scan_axis must be in [0, 3], got {}", c.scan_axis));
}

Module transformer_lm(const TransformerConfig& c) {
  validate(c);
  Module embedder("token_embedder");
  // Fans of the embedding: in = embed, as Flax's Embed uses variance scaling over features.
  embedder.param({.name = "embedding", .shape = {c.vocab, c.embed}, .dtype = c.dtype, .init = c.embedding_init,
                  .partitioning = Partitioning::by_logical({"vocab", "embed"}), .fans = {{1}, {0}, {}}});

  Module layers("layers");
  const std::vector<LayerParam> per_layer = layer_params(c);
  if (c.scan_layers) {
    for (const LayerParam& p : per_layer) layers.param(stacked(p, c.layers, c.scan_axis, c.dtype));
  } else {
    for (int64_t i = 0; i < c.layers; ++i) {
      Module layer(std::to_string(i));
      for (const LayerParam& p : per_layer) layer.param(single(p, c.dtype));
      layers.add(std::move(layer));
    }
  }

  Module decoder("decoder");
  decoder.add(std::move(layers));
  Module norm("decoder_norm");
  norm.param({.name = "scale", .shape = {c.embed}, .dtype = c.dtype, .init = c.norm_init,
              .partitioning = Partitioning::by_logical({"norm"}), .fans = {}});
  decoder.add(std::move(norm));
  if (!c.tied_embedding) {
    Module logits("logits_dense");
    logits.param({.name = "kernel", .shape = {c.embed, c.vocab}, .dtype = c.dtype, .init = c.kernel_init,
                  .partitioning = Partitioning::by_logical({"embed", "vocab"}), .fans = {{0}, {1}, {}}});
    decoder.add(std::move(logits));
  }

  Module model("model");
  model.add(std::move(embedder));
  model.add(std::move(decoder));
  return model;
}

// The forward pass.
namespace {

using nn::Params;

constexpr double kEps = 1e-5;  // MaxText's normalization_layer_epsilon default

const Tensor& at(const Params& p, const std::string& path) { return nn::param(p, path); }

// One layer's parameter: a slice of the stacked parameter, or the layer's own.
using LayerWeight = std::function<Tensor(const std::string& name)>;

LayerWeight layer(const TransformerConfig& c, const Params& p, int64_t i) {
  return [&c, &p, i](const std::string& name) {
    if (!c.scan_layers) return at(p, "decoder/layers/" + std::to_string(i) + "/" + name);
    const Tensor& stacked = at(p, "decoder/layers/" + name);
    const size_t dim = std::min(static_cast<size_t>(c.scan_axis), stacked.rank() - 1);
    return ops::index(stacked, dim, i);
  };
}

Tensor attention(const TransformerConfig& c, const LayerWeight& w, const Tensor& x) {
  const int64_t b = x.shape()[0], s = x.shape()[1], e = x.shape()[2];
  const int64_t h = c.heads, kv = c.resolved_kv_heads(), d = c.resolved_head_dim();
  auto project = [&](const std::string& name, int64_t n) {
    return ops::reshape(ops::dot(x, ops::reshape(w(name), Shape{e, n * d})), Shape{b, s, n, d});
  };
  Tensor q = project("self_attention/query/kernel", h);
  Tensor k = project("self_attention/key/kernel", kv);
  const Tensor v = project("self_attention/value/kernel", kv);
  if (c.qk_norm) {
    q = ops::rms_norm(q, w("self_attention/query_norm/scale"), kEps);
    k = ops::rms_norm(k, w("self_attention/key_norm/scale"), kEps);
  }
  // Rotated (and the queries scaled) inside the attention op, as it reads them.
  nn::AttentionOptions options;
  options.rope = ops::AttentionRope{.max_timescale = 10000.0, .query_scale = 1.0 / std::sqrt(static_cast<double>(d))};
  const Tensor merged = nn::causal_attention(q, k, v, options);
  return ops::dot(merged, ops::reshape(w("self_attention/out/kernel"), Shape{h * d, e}));
}

Tensor mlp(const TransformerConfig& c, const LayerWeight& w, const Tensor& x) {
  const Tensor hidden = c.gated_mlp ? ops::mul(ops::silu(ops::dot(x, w("mlp/wi_0/kernel"))), ops::dot(x, w("mlp/wi_1/kernel")))
                                    : ops::gelu(ops::dot(x, w("mlp/wi/kernel")));
  return ops::dot(hidden, w("mlp/wo/kernel"));
}

}  // namespace

Tensor transformer_logits(const TransformerConfig& c, const nn::Params& p, const Tensor& tokens) {
  if (tokens.rank() != 2) throw ValueError("transformer: tokens must be [batch, seq], got " + tokens.to_string());
  const Tensor& embedding = at(p, "token_embedder/embedding");
  Tensor x = ops::take(embedding, tokens);
  for (int64_t i = 0; i < c.layers; ++i) {
    const LayerWeight w = layer(c, p, i);
    x = ops::add(x, attention(c, w, ops::rms_norm(x, w("pre_self_attention_layer_norm/scale"), kEps)));
    x = ops::add(x, mlp(c, w, ops::rms_norm(x, w("post_self_attention_layer_norm/scale"), kEps)));
  }
  x = ops::rms_norm(x, at(p, "decoder/decoder_norm/scale"), kEps);
  return c.tied_embedding ? ops::dot_nt(x, embedding) : ops::dot(x, at(p, "decoder/logits_dense/kernel"));
}

}  // namespace tessel
