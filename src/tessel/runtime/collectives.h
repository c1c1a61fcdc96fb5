// Collectives over one or more mesh axes, on the device groups the mesh defines (devices that
// differ only in their coordinates along those axes), with the meaning they have inside JAX's
// shard_map, written for global Arrays: each reads every device's own shard and returns the
// Array with the sharding the result has.
//
//   all_gather(x, {"fsdp"})              // x sharded over fsdp -> replicated over fsdp
//   reduce_scatter(g, {"data"}, 0)       // per-device partial sums -> sum, dim 0 split on data
//   all_reduce(g, {"data"}, Reduction::kMean)
//   all_to_all(x, {"tensor"}, 0, 1)      // dim 1 split on tensor -> dim 0 split on tensor
//   ppermute(x, "fsdp", 1)               // device at fsdp=i sends its shard to fsdp=i+1 (mod n)
//
// Every byte moves through the runtime's Communicator, so the MPI implementation runs the same
// calls across processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tessel/runtime/array.h"
#include "tessel/runtime/communicator.h"

namespace tessel {

// Removes `axes` from the sharding: every device ends with the blocks of its whole group. Each
// axis must shard some dimension as the minor (last) axes of its tuple; otherwise the gathered
// pieces would not form a block (reshard does that).
Array all_gather(const Array& x, const std::vector<std::string>& axes);

// Every device holds a contribution of the same box (the array is not sharded over `axes`); the
// result is their reduction, with dimension `dim` further split over `axes` (appended as minor
// axes), each device keeping only its block.
Array reduce_scatter(const Array& x, const std::vector<std::string>& axes, size_t dim,
                     Reduction op = Reduction::kSum);

// The reduction of the group's contributions on every device; the sharding is unchanged. The
// array must not be sharded over `axes`.
Array all_reduce(const Array& x, const std::vector<std::string>& axes, Reduction op);

// `axes` move from dimension `concat_dim` (where they must be the minor axes) to `split_dim`
// (appended as minor axes): JAX's all_to_all(x, axes, split_dim, concat_dim, tiled=True).
Array all_to_all(const Array& x, const std::vector<std::string>& axes, size_t split_dim,
                 size_t concat_dim);

// The device at coordinate i along `axis` sends its shard to the device at (i + shift) mod n.
// Sharding unchanged; all shards in a group must have the same shape.
Array ppermute(const Array& x, std::string_view axis, int64_t shift);

}  // namespace tessel
