// Internal: what every op shares. Sharding arithmetic on per-dimension mesh axes, recording a
// node of the autodiff graph, making an op's output (concrete or abstract), operand checks, and
// the raw redistributions (no recording: each op records its own gradient).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tessel/ops/detail/local.h"
#include "tessel/ops/tensor.h"
#include "tessel/sharding/partition_spec.h"

namespace tessel::ops::detail {

using Dims = std::vector<DimSharding>;
using Axes = std::vector<std::string>;

// The spec of `s` padded with unsharded dimensions to `rank`.
Dims dims_of(const NamedSharding& s, size_t rank);
NamedSharding with_dims(const Mesh& mesh, const Dims& dims);

bool contains(const Axes& axes, const std::string& a);
bool disjoint(const Axes& a, const Axes& b);
Axes minus(const Axes& a, const Axes& b);
Axes all_axes(const Dims& dims);
Axes united(Axes a, const Axes& b);  // sorted
int64_t blocks_of(const Mesh& mesh, const DimSharding& axes);
// Whether every device holds whole rows of x's last dimension (axes of size 1 do not split it):
// the condition of the ops fused per row.
bool last_dim_whole(const Tensor& x);

// Whether a gradient must flow into t (it is in the autodiff graph): backward functions skip
// the products nobody asked for (the input batch's gradient, say).
inline bool needs(const Tensor& t) { return t.node() != nullptr; }

using Backward = std::function<std::vector<Tensor>(const Tensor&)>;
// `out` with a graph node when recording and some input is in the graph.
Tensor record(Tensor out, std::vector<Tensor> inputs, Backward backward);
// The same, for a backward that may fold the gradients its inputs have gathered so far into its
// own (Node::backward_folding).
using FoldingBackward = std::function<std::vector<Tensor>(const Tensor&, std::vector<Tensor>& pending)>;
Tensor record_folding(Tensor out, std::vector<Tensor> inputs, FoldingBackward backward);
// Whether a folding backward can add `pending` into the pass that writes an output like `like`
// on `sharding`: concrete, whole (not a partial sum), of its dtype and sharding.
bool folds_into(const Tensor& pending, const Tensor& like, const NamedSharding& sharding);

using BlockFn = std::function<void(int64_t device, const Box& box, std::byte* out)>;
// An op's result: abstract when `like` is, else every device's block written by fn.
Tensor output(const Tensor& like, const Shape& shape, DType dtype, const NamedSharding& sharding, Axes partial,
              const BlockFn& fn);

// Several results whose blocks go together device by device (see compute_blocks_once over
// OutputLayouts), not partial sums: abstract when `like` is, else each device's blocks of all of them
// written by one fn(device, boxes, outs) call.
std::vector<Tensor> outputs(const Tensor& like, const std::vector<OutputLayout>& layouts, DType dtype,
                            const std::function<void(int64_t device, const std::vector<Box>& boxes,
                                                     const std::vector<std::byte*>& outs)>& fn);

// The same, with every block this process computes written by one call (see
// compute_blocks_together).
Tensor output_together(const Tensor& like, const Shape& shape, DType dtype, const NamedSharding& sharding,
                       Axes partial, const std::function<void(const std::vector<BlockTask>&)>& fn);

void check_float(const Tensor& t, const char* op);
// Two operands of one op: floating point, one dtype, one mesh.
void check_operands(const Tensor& a, const Tensor& b, const char* op);

const std::byte* block(const Tensor& t, int64_t device);
const Box& block_box(const Tensor& t, int64_t device);

// Redistribution of a non-partial tensor.
Tensor reshard_raw(const Tensor& x, const NamedSharding& target);
// Reduces the partial axes of x: reduce-scatter into `target`'s dimensions where the target
// splits a dimension further over a partial axis (and the split is even), all-reduce the rest.
Tensor reduce_raw(const Tensor& x, const NamedSharding* target);
// Bytes a device receives to turn its block of `from` into its block of `to` (0 when `to` only
// splits `from` further: a local slice).
int64_t redistribution_bytes(const Tensor& t, const Dims& from, const Dims& to);

// Runs fn with T = float or double after x's dtype.
template <class Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  if (dtype == DType::kF32) {
    fn(float{});
  } else {
    fn(double{});
  }
}

}  // namespace tessel::ops::detail
