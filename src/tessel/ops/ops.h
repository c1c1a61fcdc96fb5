// SPMD ops on Tensors. Each op derives its output sharding from its inputs' (sharding
// propagation, as GSPMD and DTensor do), redistributes an operand only when the math needs it, and
// runs on every device's own block. On abstract tensors the same ops derive shapes, dtypes and
// shardings only (eval_shape of any function). Every op records its gradient (autodiff.h).
//
//   Tensor h = ops::relu(ops::dot(x, w1));   // (data, None) @ (None, tensor) -> (data, tensor)
//   Tensor y = ops::dot(h, w2);              // contracted over tensor: partial over tensor
//   Tensor loss = ops::mean(ops::square(ops::sub(y, target)));
//
// Redistribution picks the cheapest of: a local slice (replicated -> sharded), keeping a partial
// sum (the contraction runs on shards and its result is reduced later), or an all-gather.
#pragma once

#include <string>
#include <vector>

#include "tessel/ops/tensor.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel::ops {

// --- sharding
// The value on `target` (any mesh of the runtime). A partial input is reduce-scattered where the
// target shards a dimension over a partial axis and all-reduced over the rest first.
Tensor reshard(const Tensor& x, const NamedSharding& target);
// The user's hint: the value with `spec` on its own mesh, or with the spec its logical axes resolve
// to under `rules` (as flax's nn.with_logical_constraint).
Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec);
Tensor with_sharding_constraint(const Tensor& x, const LogicalAxes& logical, const LogicalRules& rules);
// All-reduces a partial tensor (no-op otherwise).
Tensor reduce(const Tensor& x);

// --- matrix products
// a[..., k] @ b[k, n] -> [..., n].
Tensor dot(const Tensor& a, const Tensor& b);
// g[..., n] @ b[k, n]^T -> [..., k] (the gradient of dot with respect to a).
Tensor dot_nt(const Tensor& g, const Tensor& b);
// a[..., k]^T @ g[..., n], summed over all leading dimensions -> [k, n] (the gradient of dot with
// respect to b).
Tensor dot_tn(const Tensor& a, const Tensor& g);

// Batched: a[B..., m, k] @ b[B..., k, n] -> [B..., m, n] with the same batch dimensions B;
// trans_a / trans_b read a as [B..., k, m] / b as [B..., n, k] (dot_general with batch dims first).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// --- elementwise (numpy broadcasting)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor scale(const Tensor& x, double factor);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add_scalar(const Tensor& x, double value);
Tensor relu(const Tensor& x);
Tensor square(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor gelu(const Tensor& x);  // the tanh approximation (Flax's nn.gelu default)
Tensor silu(const Tensor& x);
Tensor sigmoid(const Tensor& x);
// min(max(x, lo), hi) (jnp.clip): the gradient passes where lo < x < hi.
Tensor clip(const Tensor& x, double lo, double hi);
Tensor rsqrt(const Tensor& x);
// The same value with no gradient flowing back through it.
Tensor stop_gradient(const Tensor& x);
// f32 <-> bf16 <-> f64. A partial input is reduced first.
Tensor cast(const Tensor& x, DType dtype);

// --- reductions
// Over `dim`, which is dropped or kept with size 1. A split `dim` leaves a partial sum (sum) or
// is all-reduced (max, whose gradient is shared between the positions attaining it).
Tensor sum(const Tensor& x, size_t dim, bool keepdims = false);
Tensor mean(const Tensor& x, size_t dim, bool keepdims = false);
Tensor max(const Tensor& x, size_t dim, bool keepdims = false);
Tensor sum(const Tensor& x);   // over all dimensions: a scalar
Tensor mean(const Tensor& x);  // over all dimensions: a scalar

// Along `dim`, shifted by the maximum for range. Over a split dimension (logits split on vocab)
// the maximum is all-reduced and the normalizer is a partial sum reduced once.
Tensor softmax(const Tensor& x, size_t dim);
Tensor log_softmax(const Tensor& x, size_t dim);
// x * rsqrt(mean(x^2 over the last dimension) + eps) * scale[last] (RMSNorm), fused in one pass
// per row and its gradient in one more, when the last dimension is not split.
Tensor rms_norm(const Tensor& x, const Tensor& scale, double eps);
// -log softmax(logits)[label] at each position (optax.softmax_cross_entropy_with_integer_labels):
// labels i32/i64 of logits' shape without its last (class) dimension, the result that shape. A
// label outside [0, classes) throws ValueError.
Tensor softmax_cross_entropy_with_integer_labels(const Tensor& logits, const Tensor& labels);
// Its mean over all positions.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels);

// Sums x over the dimensions that numpy broadcasting of `shape` to x.shape() adds or stretches,
// giving `shape`: the gradient of a broadcast.
Tensor sum_to(const Tensor& x, const Shape& shape);

// --- shapes and indexing
// The same elements in a new shape. A group of merged or split dimensions keeps its split when
// only its leading dimension is split, evenly ([b, s, h*d] split on h*d <-> [b, s, h, d] split on
// h); otherwise that group is gathered first.
Tensor reshape(const Tensor& x, const Shape& shape);
// out dimension i = x dimension perm[i]; the sharding moves with the dimensions.
Tensor transpose(const Tensor& x, const std::vector<size_t>& perm);
// x[..., start:start + size, ...] along `dim` (jnp.split's pieces); a split `dim` is gathered first.
Tensor slice(const Tensor& x, size_t dim, int64_t start, int64_t size);
// The parts joined along `dim` (jnp.concatenate), on the first part's split with `dim` whole.
Tensor concat(const std::vector<Tensor>& parts, size_t dim);
// x broadcast (numpy rules) to like's shape, on like's sharding; its gradient sums back.
Tensor broadcast_like(const Tensor& x, const Tensor& like);
// x[..., i, ...] along `dim` (dropped): one layer of a stacked parameter.
Tensor index(const Tensor& x, size_t dim, int64_t i);
// The gradient of index: `shape` filled with zeros, g at position i along `dim`.
Tensor index_put(const Tensor& g, const Shape& shape, size_t dim, int64_t i);
// The gradients of several index()es of one tensor in one pass: `shape` with each g at its i
// along `dim` (summed in the given order where an i repeats), zeros elsewhere. Every g has the
// same dtype, sharding and partial axes.
Tensor index_put_all(const Shape& shape, size_t dim, const std::vector<std::pair<int64_t, Tensor>>& pieces);
// Embedding lookup: table[vocab, embed], ids (i32/i64, any shape) -> [ids..., embed]. A table
// split on vocab gives each device the rows it holds and a partial sum over the vocab axes.
Tensor take(const Tensor& table, const Tensor& ids);
// 1 at [..., labels[...]], 0 elsewhere, with like's shape, dtype and sharding (no gradient).
Tensor one_hot(const Tensor& labels, const Tensor& like);
// Scores [..., query, key]: entries with key > query become a large negative value; with a
// `window` > 0 also those with query - key >= window (MaxText's LOCAL_SLIDING attention).
Tensor causal_mask(const Tensor& x, int64_t window = 0);
// Rotary position embedding (MaxText's default: halves of head_dim paired, timescales
// max_timescale^(2k/head_dim)) on [..., seq, heads..., head_dim] with the sequence at `seq_dim`,
// times `scale`: the bits of scale(rope(x, seq_dim, max_timescale), scale) in one pass (a query's
// 1 / sqrt(head_dim)).
Tensor rope(const Tensor& x, size_t seq_dim, double max_timescale = 10000.0, double scale = 1.0);
// MaxText's LLaMARotaryEmbedding (llama3.1's model files): neighbours (2k, 2k+1) of head_dim
// paired, and with `llama3_scaling` Llama 3.1's frequencies (factor 8, low/high frequency
// factors 1 and 4 over an original context of 8192).
Tensor llama_rope(const Tensor& x, size_t seq_dim, double max_timescale, bool llama3_scaling);
// MaxText's YarnRotaryEmbedding (DeepSeek's rope): frequencies 1 / max_timescale^(2k/d) blended
// towards 1 / factor of themselves below YaRN's correction range (beta_fast, beta_slow over
// original_max_position); `interleave` pairs neighbours (2k, 2k+1) and returns the rotated pairs
// as real parts then imaginary parts (MaxText's output layout), else halves are paired;
// `attention_scaling` multiplies by 0.1 ln(factor) + 1.
struct YarnRope {
  double max_timescale = 10000, factor = 40, beta_fast = 32, beta_slow = 1;
  int64_t original_max_position = 4096;
  bool interleave = true, truncate = true, attention_scaling = false;
};
Tensor yarn_rope(const Tensor& x, size_t seq_dim, const YarnRope& yarn);

}  // namespace tessel::ops
