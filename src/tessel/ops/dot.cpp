// Products of a tensor and a 2-D weight (dot, dot_nt, dot_tn): the sharding plan that moves the
// fewest bytes, and the per-device GEMMs (oneDNN or OpenBLAS through local.h, or packed_gemm for
// many devices of few rows).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/ops/detail/local.h"
#include "tessel/ops/detail/packed_gemm.h"
#include "tessel/ops/detail/propagation.h"
#include "tessel/ops/ops.h"
#include "tessel/runtime/device.h"
#include "tessel/runtime/reshard.h"

namespace tessel::ops {
namespace {

using namespace detail;

// out[..., n] = sum_k a[..., k] * B[k, n], B = b or b^T. `kk` splits k on both operands.
struct DotPlan {
  Dims a, b, out;
  Axes partial;
};

// The largest block of a dimension of `extent` split over `axes`.
int64_t block_extent(int64_t extent, const Mesh& mesh, const DimSharding& axes) {
  return (extent + blocks_of(mesh, axes) - 1) / blocks_of(mesh, axes);
}

DotPlan plan_dot(const Tensor& a, const Tensor& b, bool trans_b) {
  const size_t ka = a.rank() - 1, kb = trans_b ? 1 : 0, nb = 1 - kb;
  const Dims ad = dims_of(a.sharding(), a.rank()), bd = dims_of(b.sharding(), 2);
  Dims lead(ad.begin(), ad.end() - 1);
  const Axes used = all_axes(lead);
  const DimSharding n_axes = minus(bd[nb], used);
  Axes forbidden = united(used, n_axes);
  auto usable = [&](const DimSharding& k) { return disjoint(k, forbidden) ? k : DimSharding{}; };
  // Candidates for the split of k: a's, b's, none. Cost: bytes moved now plus, for a split k, the
  // reduction of the partial result later (about twice the output block).
  std::vector<DimSharding> candidates{usable(ad[ka]), usable(bd[kb]), {}};
  int64_t out_block = static_cast<int64_t>(item_size(a.dtype())) * block_extent(b.shape()[nb], a.mesh(), n_axes);
  for (size_t d = 0; d < ka; ++d) out_block *= block_extent(a.shape()[d], a.mesh(), lead[d]);
  DotPlan best;
  int64_t best_cost = -1;
  for (const auto& k : candidates) {
    Dims na = ad, nbd = bd;
    na[ka] = k;
    nbd[kb] = k;
    nbd[nb] = n_axes;
    const int64_t cost = redistribution_bytes(a, ad, na) + redistribution_bytes(b, bd, nbd) + (k.empty() ? 0 : 2 * out_block);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      Dims out = lead;
      out.push_back(n_axes);
      best = {na, nbd, out, k};
      std::sort(best.partial.begin(), best.partial.end());
    }
  }
  return best;
}

// Whether an f32 product on a multi-device mesh runs packed_gemm: each device holds at most 128
// rows of `a` (split as `dims`). Decided from the global shapes and shardings alone: every
// process of a multi-process mesh takes the same kernel, so results stay bit-identical however
// the devices are spread over processes. Measured on the 2-core VM with 64 rows per device
// (DotReluDot on data=8), OpenBLAS packed the 16 MiB weights again in every call (28 ms of a
// 165 ms step) and cleared each 16 MiB weight gradient before writing it; with 256 (the LM on
// data=8) OpenBLAS's kernel was the faster one, and oneDNN's, which runs those products now
// (local.h), is faster still. On DotReluDot's data=8 products oneDNN per 64-row device ran at
// 0.77 to 0.94x the rate of OpenBLAS on all 512 rows at once, below packed_gemm: it keeps them.
bool few_rows_per_device(const Tensor& a, const Dims& dims) {
  const Mesh& mesh = a.mesh();
  if (a.dtype() != DType::kF32 || mesh.device_count() < 2 || !packed_gemm_supported()) return false;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < a.rank(); ++d) rows *= block_extent(a.shape()[d], mesh, dims[d]);
  return rows <= 128;
}

// Whether the devices' products share B blocks that packed_gemm packs once: B replicated over
// several devices, few rows per device.
bool shares_weight(const Tensor& a, const DotPlan& plan) {
  return a.mesh().device_count() / blocks_of(a.mesh(), all_axes(plan.b)) >= 2 && few_rows_per_device(a, plan.a);
}

// `box` of the 2-D x as pieces read in place from x's shards in this process (one per distinct
// block, first holder), or nullopt unless shards tile it exactly. For B gathered over axes that
// split it (an FSDP weight), the pieces are the shards the gather would have copied.
std::optional<Pieces> pieces_of(const Tensor& x, const Box& box) {
  if (box.empty()) return Pieces::dense(box.extent(0), box.extent(1), nullptr);
  std::vector<const Shard*> inside;
  for (const Shard* s : x.shards().addressable_shards()) {
    if (s->box.empty() || !box.contains(s->box)) continue;
    if (std::none_of(inside.begin(), inside.end(), [&](const Shard* t) { return t->box == s->box; })) inside.push_back(s);
  }
  Pieces p{{}, {}, {}};
  for (const Shard* s : inside) {
    p.row_at.push_back(s->box.start(0) - box.start(0));
    p.col_at.push_back(s->box.start(1) - box.start(1));
  }
  for (auto* at : {&p.row_at, &p.col_at}) {
    std::sort(at->begin(), at->end());
    at->erase(std::unique(at->begin(), at->end()), at->end());
  }
  if (p.row_at.empty() || p.row_at[0] != 0 || p.col_at[0] != 0) return std::nullopt;
  p.row_at.push_back(box.extent(0));
  p.col_at.push_back(box.extent(1));
  for (size_t i = 0; i + 1 < p.row_at.size(); ++i) {
    for (size_t j = 0; j + 1 < p.col_at.size(); ++j) {
      const Box cell({box.start(0) + p.row_at[i], box.start(1) + p.col_at[j]},
                     {box.start(0) + p.row_at[i + 1], box.start(1) + p.col_at[j + 1]});
      auto s = std::find_if(inside.begin(), inside.end(), [&](const Shard* t) { return t->box == cell; });
      if (s == inside.end()) return std::nullopt;
      p.data.push_back(reinterpret_cast<const float*>((*s)->buffer.data()));
    }
  }
  return p;
}

// The distinct blocks of B (as `target` places it) that this process's devices need, each as
// pieces of b's shards read in place; nullopt unless b's shards here tile every one of them.
using WeightBlocks = std::vector<std::pair<Box, Pieces>>;
std::optional<WeightBlocks> weight_blocks(const Tensor& b, const NamedSharding& target) {
  WeightBlocks out;
  for (const Shard* s : b.shards().addressable_shards()) {
    const Box box = target.device_box(s->device, b.shape());
    if (std::any_of(out.begin(), out.end(), [&](const auto& w) { return w.first == box; })) continue;
    std::optional<Pieces> pieces = pieces_of(b, box);
    if (!pieces) return std::nullopt;
    out.emplace_back(box, std::move(*pieces));
  }
  return out;
}

// Every block's product, the devices that need the same block of B (`b_sharding`'s) multiplied
// together, B from `weights` (weight_blocks of b_sharding).
void multiply_shared(const Tensor& a, const Shape& b_shape, const NamedSharding& b_sharding, const WeightBlocks& weights,
                     bool trans_b, const std::vector<BlockTask>& blocks) {
  struct Group {
    const std::pair<Box, Pieces>* weight;
    std::vector<RowBlock> rows;
  };
  std::vector<Group> groups;
  for (const BlockTask& t : blocks) {
    const Box box = b_sharding.device_box(t.device, b_shape);
    const auto w = std::find_if(weights.begin(), weights.end(), [&](const auto& x) { return x.first == box; });
    if (w == weights.end()) throw Error("dot: this process does not hold the weight's block " + box.to_string());
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.weight == &*w; });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{&*w, {}});
    const int64_t n = t.box.extent(t.box.rank() - 1);
    it->rows.push_back({t.box.volume() / n, reinterpret_cast<const float*>(block(a, t.device)), reinterpret_cast<float*>(t.out)});
  }
  for (const Group& g : groups) {
    const Box& box = g.weight->first;
    packed_gemm(false, trans_b, box.extent(trans_b ? 1 : 0), box.extent(trans_b ? 0 : 1), g.weight->second, g.rows);
  }
}

// What a gather of b into `target` would have charged this process's devices as received.
void count_gathered(const Tensor& b, const NamedSharding& target) {
  const ReshardPlan plan(b.sharding(), target, b.shape(), b.dtype());
  const Runtime& rt = b.array().runtime();
  for (const DeviceTraffic& t : plan.devices()) {
    if (t.bytes_received > 0 && rt.is_addressable(t.device)) rt.device(t.device).add_received(t.bytes_received);
  }
}

// Every block of a dot_tn result summed over the devices of its group along `axes` (in group
// order, as the runtime's reductions add them), each device's term its rows of a and g.
void sum_over_group(const Tensor& a, const Tensor& g, const Axes& axes, const std::vector<BlockTask>& blocks) {
  const auto groups = a.mesh().subgroups(axes);
  for (const BlockTask& t : blocks) {
    const auto group = std::find_if(groups.begin(), groups.end(), [&](const std::vector<int64_t>& members) {
      return std::find(members.begin(), members.end(), t.device) != members.end();
    });
    std::vector<SumTerm> terms;
    for (int64_t d : *group) {
      const Box& ab = block_box(a, d);
      const int64_t rows = ab.volume() / ab.extent(ab.rank() - 1);
      terms.push_back({rows, reinterpret_cast<const float*>(block(a, d)), reinterpret_cast<const float*>(block(g, d))});
    }
    packed_gemm_sum(t.box.extent(0), t.box.extent(1), terms, reinterpret_cast<float*>(t.out));
  }
}

Backward dot_tn_backward(const Tensor& a, const Tensor& g) {
  return [a, g](const Tensor& dc) {
    return std::vector<Tensor>{needs(a) ? dot_nt(g, dc) : Tensor(), needs(g) ? dot(a, dc) : Tensor()};
  };
}

// With `plus` (a gradient gathered so far, or null): the product added onto it where the GEMMs
// can start from its blocks, and *plus cleared; else *plus is left for the caller to add.
Tensor dot_impl(const Tensor& a_in, const Tensor& b_in, bool trans_b, Tensor* plus = nullptr) {
  const char* op = trans_b ? "dot_nt" : "dot";
  check_operands(a_in, b_in, op);
  const size_t kb = trans_b ? 1 : 0;
  if (a_in.rank() < 1 || b_in.rank() != 2 || a_in.shape()[a_in.rank() - 1] != b_in.shape()[kb]) {
    throw ValueError(std::string(op) + ": shapes do not contract: " + a_in.to_string() + " and " + b_in.to_string());
  }
  const Tensor a0 = reduce_raw(a_in, nullptr), b0 = reduce_raw(b_in, nullptr);
  const DotPlan plan = plan_dot(a0, b0, trans_b);
  const Tensor a = reshard_raw(a0, with_dims(a0.mesh(), plan.a));
  const NamedSharding b_sharding = with_dims(b0.mesh(), plan.b);
  std::vector<int64_t> out_dims(a.shape().dims().begin(), a.shape().dims().end() - 1);
  out_dims.push_back(b0.shape()[1 - kb]);
  const Shape shape(out_dims);
  if (shares_weight(a, plan)) {
    // B is packed anyway: packed from the shards in place, a gather's copy of a sharded weight
    // (FSDP on one host: 16 MiB per product of DotReluDot) is not needed. The devices are charged
    // the bytes the gather would have brought them, as a replica sharing a local copy is.
    Tensor b = b0;  // holds the gathered weight, when one is needed, while its pieces are read
    std::optional<WeightBlocks> weights;
    if (!a.is_abstract()) weights = weight_blocks(b0, b_sharding);  // an abstract b0 throws, naming it
    if (weights && b0.sharding() != b_sharding) {
      count_gathered(b0, b_sharding);
    } else if (!weights) {
      b = reshard_raw(b0, b_sharding);
      if (!a.is_abstract()) weights = weight_blocks(b, b_sharding);
    }
    return output_together(a, shape, a.dtype(), with_dims(a.mesh(), plan.out), plan.partial,
                           [&](const std::vector<BlockTask>& blocks) {
                             multiply_shared(a, b0.shape(), b_sharding, *weights, trans_b, blocks);
                           });
  }
  const Tensor b = reshard_raw(b0, b_sharding);
  const NamedSharding out_sharding = with_dims(a.mesh(), plan.out);
  // A gradient's next term added in the GEMM (which then skips clearing its output) instead of
  // in a pass of its own over both: the sum as the GEMM accumulates it, the bits of add() where
  // k is one block of the GEMM's (the LM's query, key and value products, all of k 256).
  Tensor start;
  if (plus && plan.partial.empty() && folds_into(*plus, a, out_sharding)) start = std::exchange(*plus, Tensor());
  return output(a, shape, a.dtype(), out_sharding, plan.partial,
                [&](int64_t device, const Box& box, std::byte* out) {
                  const Box& ab = block_box(a, device);
                  const int64_t k = ab.extent(ab.rank() - 1);
                  const int64_t m = box.volume() / std::max<int64_t>(box.extent(box.rank() - 1), 1);
                  const int64_t n = box.extent(box.rank() - 1);
                  if (box.volume() == 0) return;
                  if (start.defined()) {
                    const auto row = static_cast<size_t>(n) * item_size(a.dtype());
                    const std::byte* from = block(start, device);
                    detail::split_range(m, 64, [&](int64_t lo, int64_t hi) {
                      const size_t at = static_cast<size_t>(lo) * row;
                      std::memcpy(out + at, from + at, static_cast<size_t>(hi - lo) * row);
                    });
                  }
                  detail::gemm(a.dtype(), false, trans_b, m, n, k, block(a, device), block(b, device), out,
                               start.defined());
                });
}

}  // namespace

Tensor dot(const Tensor& a, const Tensor& b) {
  // a's gradient starts from what a has gathered so far (the queries', keys' and values'
  // products of one normalized input, say).
  return record_folding(dot_impl(a, b, false), {a, b}, [a, b](const Tensor& g, std::vector<Tensor>& pending) {
    return std::vector<Tensor>{needs(a) ? dot_impl(g, b, true, &pending[0]) : Tensor(),
                               needs(b) ? dot_tn(a, g) : Tensor()};
  });
}

Tensor dot_nt(const Tensor& g, const Tensor& b) {
  return record(dot_impl(g, b, true), {g, b}, [g, b](const Tensor& dy) {
    return std::vector<Tensor>{needs(g) ? dot(dy, b) : Tensor(), needs(b) ? dot_tn(dy, g) : Tensor()};
  });
}

Tensor dot_tn(const Tensor& a_in, const Tensor& g_in) {
  check_operands(a_in, g_in, "dot_tn");
  const size_t r = a_in.rank();
  if (r < 1 || g_in.rank() != r ||
      !std::equal(a_in.shape().dims().begin(), a_in.shape().dims().end() - 1, g_in.shape().dims().begin())) {
    throw ValueError("dot_tn: leading dimensions differ: " + a_in.to_string() + " and " + g_in.to_string());
  }
  Tensor a = reduce_raw(a_in, nullptr), g = reduce_raw(g_in, nullptr);
  const Dims ad = dims_of(a.sharding(), r), gd = dims_of(g.sharding(), r);
  // Output [k, n]: k split like a's last dim, n like g's (minus what k uses); the leading
  // dimensions are contracted where a splits them, and g follows a there.
  const DimSharding k_axes = ad[r - 1];
  const DimSharding n_axes = minus(gd[r - 1], k_axes);
  const Axes forbidden = united(k_axes, n_axes);
  Dims na = ad, ng = gd;
  Axes partial;
  for (size_t i = 0; i + 1 < r; ++i) {
    const DimSharding lead = disjoint(ad[i], forbidden) ? ad[i] : (disjoint(gd[i], forbidden) ? gd[i] : DimSharding{});
    na[i] = lead;
    ng[i] = lead;
    partial = united(partial, lead);
  }
  ng[r - 1] = n_axes;
  // Leading dims chosen from g may clash with a's k axes only if a used them there: checked above.
  a = reshard_raw(a, with_dims(a.mesh(), na));
  g = reshard_raw(g, with_dims(g.mesh(), ng));
  const Shape shape{a.shape()[r - 1], g.shape()[r - 1]};
  const bool short_rows = few_rows_per_device(a, na);
  const NamedSharding sharding = with_dims(a.mesh(), {k_axes, n_axes});
  // Few rows per device contracted over mesh axes (the weight gradients of data or FSDP
  // parallelism): the devices' products are summed here, not left as partial sums. In one process
  // the sum is formed in the product itself (each tile of the gradient summed over the devices
  // while in cache: no per-device gradient written and read back, 8 x 16 MiB a weight for
  // DotReluDot on data=8); across processes, by the runtime's all-reduce of the same products, in
  // the same order: the same bits either way, so the choice depends on the global shapes alone.
  const bool sum_here = short_rows && !partial.empty();
  if (sum_here && !a.is_abstract() && a.shards().is_fully_addressable() && g.shards().is_fully_addressable()) {
    Tensor out = output_together(a, shape, a.dtype(), sharding, {},
                                 [&](const std::vector<BlockTask>& blocks) { sum_over_group(a, g, partial, blocks); });
    return record(out, {a_in, g_in}, dot_tn_backward(a_in, g_in));
  }
  Tensor out = output(a, shape, a.dtype(), sharding, partial,
                      [&](int64_t device, const Box& box, std::byte* o) {
                        const Box& ab = block_box(a, device);
                        const int64_t rows = ab.volume() / std::max<int64_t>(ab.extent(r - 1), 1);
                        if (box.volume() == 0) return;
                        if (short_rows) {
                          packed_gemm(true, false, rows, box.extent(1), reinterpret_cast<const float*>(block(g, device)),
                                      {{box.extent(0), reinterpret_cast<const float*>(block(a, device)), reinterpret_cast<float*>(o)}});
                          return;
                        }
                        detail::gemm(a.dtype(), true, false, box.extent(0), box.extent(1), rows, block(a, device),
                                     block(g, device), o, false);
                      });
  if (sum_here) out = reduce_raw(out, nullptr);
  return record(out, {a_in, g_in}, dot_tn_backward(a_in, g_in));
}

}  // namespace tessel::ops
