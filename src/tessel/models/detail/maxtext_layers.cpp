#include "tessel/models/detail/maxtext_layers.h"

#include <cmath>
#include <numeric>
#include <optional>

#include "tessel/core/error.h"
#include "tessel/nn/attention.h"
#include "tessel/ops/ops.h"

namespace tessel::maxtext {
namespace {

std::vector<size_t> range(size_t from, size_t to) {
  std::vector<size_t> out(to - from);
  std::iota(out.begin(), out.end(), from);
  return out;
}

ParamDecl param(std::string name, std::vector<int64_t> shape, LogicalAxes axes, Initializer init, DType dtype,
                Fans fans = {}) {
  return ParamDecl{.name = std::move(name), .shape = Shape(std::move(shape)), .dtype = dtype, .init = std::move(init),
                   .partitioning = Partitioning::by_logical(std::move(axes)), .fans = std::move(fans)};
}

}  // namespace

Initializer kernel_init(const MaxTextConfig& c, double divisor) {
  // Dividing truncated-normal samples by d scales their variance by 1/d^2.
  return Initializer::variance_scaling(c.dense_init_scale / (divisor * divisor), FanMode::kFanIn,
                                       Distribution::kTruncatedNormal);
}

Module dense(std::string name, const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
             LogicalAxes axes, Initializer init, DType dtype, bool bias) {
  Module m(std::move(name));
  std::vector<int64_t> shape = in_shape;
  shape.insert(shape.end(), out_shape.begin(), out_shape.end());
  const LogicalAxes bias_axes(axes.end() - static_cast<std::ptrdiff_t>(out_shape.size()), axes.end());
  m.param(param("kernel", shape, std::move(axes), std::move(init), dtype,
                {.in_axes = range(0, in_shape.size()), .out_axes = range(in_shape.size(), shape.size()), .batch_axes = {}}));
  if (bias) m.param(param("bias", out_shape, bias_axes, Initializer::zeros(), dtype));
  return m;
}

Module rms_norm(std::string name, int64_t features, DType dtype) {
  Module m(std::move(name));
  m.param(param("scale", {features}, {std::string("norm")}, Initializer::ones(), dtype));
  return m;
}

Module attention(std::string name, const MaxTextConfig& c, bool qk_norm, bool query_scaled, bool bias) {
  const int64_t e = c.emb_dim, h = c.num_query_heads, kv = c.num_kv_heads, d = c.head_dim;
  const DType w = c.weight_dtype;
  Module m(std::move(name));
  const double depth = query_scaled ? std::sqrt(static_cast<double>(d)) : 1.0;
  m.add(dense("query", {e}, {h, d}, {"embed", "q_heads", "kv"}, kernel_init(c, depth), w, bias));
  m.add(dense("key", {e}, {kv, d}, {"embed", "kv_heads", "kv_head_dim"}, kernel_init(c), w, bias));
  m.add(dense("value", {e}, {kv, d}, {"embed", "kv_heads", "kv_head_dim"}, kernel_init(c), w, bias));
  m.add(dense("out", {h, d}, {e}, {"heads", "kv", "embed"}, kernel_init(c), w, bias));
  if (c.attention_sink) m.param(param("sinks", {h}, {std::nullopt}, Initializer::zeros(), w));
  if (qk_norm) {
    m.add(rms_norm("query_norm", d, w));
    m.add(rms_norm("key_norm", d, w));
  }
  return m;
}

Module mla(std::string name, const MaxTextConfig& c) {
  const int64_t e = c.emb_dim, h = c.num_query_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const DType w = c.weight_dtype;
  Module m(std::move(name));
  if (c.q_lora_rank == 0) {
    m.add(dense("query", {e}, {h, qk}, {"embed", "q_heads", "kv"}, kernel_init(c), w));
  } else {
    m.add(dense("wq_a", {e}, {c.q_lora_rank}, {"embed", "q_lora_up_proj"}, kernel_init(c), w));
    m.add(rms_norm("q_norm", c.q_lora_rank, w));
    m.add(dense("wq_b", {c.q_lora_rank}, {h, qk}, {"q_lora", "q_heads", "kv"}, kernel_init(c), w));
  }
  m.add(dense("wkv_a", {e}, {c.kv_lora_rank + c.qk_rope_head_dim}, {"embed", "kv_lora_up_proj"}, kernel_init(c), w));
  m.add(rms_norm("kv_norm", c.kv_lora_rank, w));
  m.add(dense("wkv_b", {c.kv_lora_rank}, {h, c.qk_nope_head_dim + c.v_head_dim}, {"kv_lora", "kv_heads", "kv_head_dim"},
              kernel_init(c), w));
  m.add(dense("out", {h, c.v_head_dim}, {e}, {"heads", "kv", "embed"}, kernel_init(c), w));
  return m;
}

Module mlp_block(std::string name, const MaxTextConfig& c, int64_t intermediate, bool bias) {
  const int64_t e = c.emb_dim;
  Module m(std::move(name));
  const size_t n = c.mlp_activations.size();
  for (size_t i = 0; i < n; ++i)
    m.add(dense(n == 1 ? "wi" : "wi_" + std::to_string(i), {e}, {intermediate}, {"embed", "mlp"}, kernel_init(c),
                c.weight_dtype, bias));
  m.add(dense("wo", {intermediate}, {e}, {"mlp", "embed"}, kernel_init(c), c.weight_dtype, bias));
  return m;
}

Module routed_moe(std::string name, const MaxTextConfig& c, LogicalAxes gate_axes, int64_t intermediate) {
  const int64_t e = c.emb_dim, x = c.num_experts;
  const DType w = c.weight_dtype;
  Module m(std::move(name));
  m.add(dense("gate", {e}, {x}, std::move(gate_axes), kernel_init(c), w, c.routed_bias));
  // MaxText initializes the expert kernels with in_axis 0 and out_axis 1 of [experts, in, out].
  const Fans fans{.in_axes = {0}, .out_axes = {1}, .batch_axes = {}};
  m.param(param("wi_0", {x, e, intermediate}, {"exp", "embed_moe", "mlp_moe"}, kernel_init(c), w, fans));
  m.param(param("wi_1", {x, e, intermediate}, {"exp", "embed_moe", "mlp_moe"}, kernel_init(c), w, fans));
  m.param(param("wo", {x, intermediate, e}, {"exp", "mlp_moe", "embed_moe"}, kernel_init(c), w, fans));
  if (c.mlp_bias) {
    m.param(param("wi_0_bias", {x, intermediate}, {"exp", "activation_mlp"}, Initializer::zeros(), w));
    m.param(param("wi_1_bias", {x, intermediate}, {"exp", "activation_mlp"}, Initializer::zeros(), w));
    m.param(param("wo_bias", {x, e}, {"exp", "activation_embed"}, Initializer::zeros(), w));
  }
  return m;
}

Module routed_and_shared_moe(std::string name, const MaxTextConfig& c) {
  Module m(std::move(name));
  m.add(routed_moe("MoeBlock_0", c, {std::string("embed_moe"), std::nullopt}, c.moe_mlp_dim));
  m.add(mlp_block("shared_experts", c, c.shared_experts * c.moe_mlp_dim));
  return m;
}

Module stacked(std::string name, const Module& layer, int64_t n, int64_t axis) {
  const std::string logical = name;
  return stacked(std::move(name), layer, n, axis, logical);
}

Module stacked(std::string name, const Module& layer, int64_t n, int64_t axis, const std::string& logical) {
  Module out(std::move(name));
  for (const ParamDecl& p : layer.params()) {
    ParamDecl q = p;
    const size_t at = std::min(static_cast<size_t>(axis), p.shape.rank());
    std::vector<int64_t> dims(p.shape.dims().begin(), p.shape.dims().end());
    dims.insert(dims.begin() + static_cast<std::ptrdiff_t>(at), n);
    q.shape = Shape(std::move(dims));
    q.partitioning.logical.insert(q.partitioning.logical.begin() + static_cast<std::ptrdiff_t>(at),
                                  logical);
    auto shift = [at](std::vector<size_t>& axes) {
      for (size_t& a : axes) a += a >= at ? 1 : 0;
    };
    // Default fans (none declared) mean the last two non-batch dims, which stay the same ones.
    shift(q.fans.in_axes);
    shift(q.fans.out_axes);
    shift(q.fans.batch_axes);
    q.fans.batch_axes.push_back(at);
    out.param(std::move(q));
  }
  for (const Module& child : layer.children()) out.add(stacked(child.name(), child, n, axis, logical));
  return out;
}

}  // namespace tessel::maxtext

// Forward passes.
namespace tessel::maxtext {

Weights sub(const Weights& w, const std::string& name) {
  return [w, name](const std::string& path) { return w(name + "/" + path); };
}

Tensor rms_norm_forward(const MaxTextConfig& c, const Weights& norm, const Tensor& x) {
  Tensor scale = norm("scale");
  if (scale.dtype() != x.dtype()) scale = ops::cast(scale, x.dtype());  // gpt-oss's float32 norms
  return ops::rms_norm(x, scale, c.normalization_layer_epsilon);
}

namespace {

enum class RopeKind { kDefault, kLlama31, kYarn };

// MaxText's choice (attentions.py, init_rotary_embedding) for these families; throws for what
// tessel's forward pass does not have.
RopeKind rope_kind(const MaxTextConfig& c) {
  const bool llama31 = c.model_name.starts_with("llama3.1") || c.rope_type.starts_with("llama3.1");
  const bool yarn = !llama31 && c.rope_type.starts_with("yarn");
  if (!llama31 && !yarn && c.rope_type != "default")
    throw ValueError("rope_type '" + c.rope_type + "': tessel's forward pass has the default, llama3.1 and yarn ropes");
  if (c.rope_min_timescale != 1 || (!llama31 && !yarn && c.rope_linear_scaling_factor != 1))
    throw ValueError("rope_min_timescale and rope_linear_scaling_factor other than 1 are not in tessel's forward pass yet");
  return llama31 ? RopeKind::kLlama31 : yarn ? RopeKind::kYarn : RopeKind::kDefault;
}

}  // namespace

Tensor rope_forward(const MaxTextConfig& c, const Tensor& x) {
  switch (rope_kind(c)) {
    case RopeKind::kYarn:
      return ops::yarn_rope(x, 1, {.max_timescale = c.rope_max_timescale, .factor = c.rope_factor,
                                   .beta_fast = c.beta_fast, .beta_slow = c.beta_slow,
                                   .original_max_position = c.original_max_position_embeddings,
                                   .interleave = c.rope_interleave, .truncate = c.rope_truncate,
                                   .attention_scaling = c.rope_attention_scaling});
    case RopeKind::kLlama31:
      return ops::llama_rope(x, 1, c.rope_max_timescale, c.rope_use_scale);
    case RopeKind::kDefault:
      break;
  }
  return ops::rope(x, 1, c.rope_max_timescale);
}

Tensor attention_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x, bool qk_norm, double query_scale,
                         int64_t window) {
  const int64_t b = x.shape()[0], s = x.shape()[1], e = x.shape()[2];
  const int64_t h = c.num_query_heads, kv = c.num_kv_heads, d = c.head_dim;
  auto project = [&](const std::string& name, int64_t n) {
    Tensor y = ops::dot(x, ops::reshape(w(name + "/kernel"), Shape{e, n * d}));
    if (c.attention_bias) y = ops::add(y, ops::reshape(w(name + "/bias"), Shape{n * d}));
    return ops::reshape(y, Shape{b, s, n, d});
  };
  Tensor q = project("query", h);
  Tensor k = project("key", kv);
  const Tensor v = project("value", kv);
  if (qk_norm) {
    q = rms_norm_forward(c, sub(w, "query_norm"), q);
    k = rms_norm_forward(c, sub(w, "key_norm"), k);
  }
  nn::AttentionOptions options;
  options.window = window;
  if (c.attention_sink) options.sinks = w("sinks");
  if (rope_kind(c) == RopeKind::kDefault) {
    // Rotated and scaled inside the attention op: the bits of the rope and scale ops below.
    options.rope = ops::AttentionRope{.max_timescale = c.rope_max_timescale, .query_scale = query_scale};
  } else {
    q = rope_forward(c, q);
    k = rope_forward(c, k);
    if (query_scale != 1.0) q = ops::scale(q, query_scale);
  }
  const Tensor merged = nn::causal_attention(q, k, v, options);
  Tensor out = ops::dot(merged, ops::reshape(w("out/kernel"), Shape{h * d, e}));
  if (c.attention_bias) out = ops::add(out, w("out/bias"));
  return out;
}

Tensor mla_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x) {
  const int64_t b = x.shape()[0], s = x.shape()[1], e = x.shape()[2], h = c.num_query_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, qk = nope + rope, dv = c.v_head_dim;
  const int64_t kv_rank = c.kv_lora_rank;
  // The softmax scale goes into the query (attention_mla.py), with YaRN's mscale^2 when the
  // context is extended.
  double softmax_scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c.max_position_embeddings > c.original_max_position_embeddings) {
    const double m = 0.1 * c.mscale * std::log(c.rope_factor) + 1.0;
    softmax_scale *= m * m;
  }
  auto project = [&](const Tensor& in, const std::string& kernel, int64_t heads, int64_t dim) {
    const Tensor k = w(kernel);
    return ops::reshape(ops::dot(in, ops::reshape(k, Shape{k.shape()[0], heads * dim})),
                        Shape{in.shape()[0], in.shape()[1], heads, dim});
  };
  Tensor q;
  if (c.q_lora_rank == 0) {
    q = project(x, "query/kernel", h, qk);
  } else {
    const Tensor low = rms_norm_forward(c, sub(w, "q_norm"), ops::dot(x, w("wq_a/kernel")));
    q = project(low, "wq_b/kernel", h, qk);
  }
  const Tensor q_rope = rope_forward(c, ops::slice(q, 3, nope, rope));
  const Tensor query = ops::scale(ops::concat({ops::slice(q, 3, 0, nope), q_rope}, 3), softmax_scale);
  const Tensor low_kv = ops::dot(x, w("wkv_a/kernel"));  // [b, s, kv_lora_rank + rope]
  const Tensor main = rms_norm_forward(c, sub(w, "kv_norm"), ops::slice(low_kv, 2, 0, kv_rank));
  const Tensor key_rope = rope_forward(c, ops::reshape(ops::slice(low_kv, 2, kv_rank, rope), Shape{b, s, 1, rope}));
  const Tensor kv = project(main, "wkv_b/kernel", h, nope + dv);
  const Tensor key = ops::concat({ops::slice(kv, 3, 0, nope), ops::broadcast_like(key_rope, q_rope)}, 3);
  const Tensor merged = nn::causal_attention(query, key, ops::slice(kv, 3, nope, dv));
  return ops::dot(merged, ops::reshape(w("out/kernel"), Shape{h * dv, e}));
}

Tensor mlp_forward(const MaxTextConfig& c, const Weights& w, const Tensor& x) {
  const size_t n = c.mlp_activations.size();
  std::optional<Tensor> hidden;
  for (size_t i = 0; i < n; ++i) {
    const std::string& act = c.mlp_activations[i];
    Tensor y = ops::dot(x, w((n == 1 ? std::string("wi") : "wi_" + std::to_string(i)) + "/kernel"));
    if (act == "silu") y = ops::silu(y);
    else if (act == "gelu") y = ops::gelu(y);
    else if (act == "relu") y = ops::relu(y);
    else if (act != "linear")
      throw ValueError("mlp_activations: tessel's forward pass has silu, gelu, relu and linear, not '" + act + "'");
    hidden = hidden ? ops::mul(*hidden, y) : y;
  }
  return ops::dot(*hidden, w("wo/kernel"));
}

}  // namespace tessel::maxtext
