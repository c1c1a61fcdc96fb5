// An Array is a global array placed on devices: global shape, dtype, NamedSharding, and one shard
// per mesh device (its Box and a Buffer holding exactly that box, row-major). Each device holds
// its own buffer of a replicated block, as in JAX, charged to it; in one process the buffers of
// equal replicas may share their bytes. Arrays are immutable values: copying one shares the
// buffers; every operation returns a new Array.
//
// A shard of a device owned by another process is known by its Box, but its Buffer is invalid
// (not addressable). Replicas are not checked for equality: a collective reads each device's own
// shard, so per-device contributions (a partial sum) are held as an Array too.
//
//   auto rt = tessel::Runtime::host(8);
//   tessel::NamedSharding rows(tessel::Mesh::parse("fsdp=8"), {{"fsdp"}});
//   auto x = tessel::device_put(rt, tessel::HostArray::from<float>({8, 2}, values), rows);
//   x.shard(3).box == tessel::Box({3, 0}, {4, 2});  tessel::to_host(x) == host
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/dtype.h"
#include "tessel/core/host_array.h"
#include "tessel/core/shape.h"
#include "tessel/runtime/buffer.h"
#include "tessel/runtime/runtime.h"
#include "tessel/sharding/named_sharding.h"

namespace tessel {
namespace detail {
class ArrayBuilder;
}

struct Shard {
  int64_t device = 0;
  Box box;                 // in global coordinates
  int64_t replica_id = 0;  // 0 for the first device (mesh order) holding this block
  Buffer buffer;           // invalid when the device belongs to another process
  bool is_addressable() const { return buffer.valid(); }
};

class Array {
 public:
  // Checks that `shards` has one entry per mesh device in mesh order, with the sharding's Box,
  // and a buffer of exactly box volume * item size bytes on that device (or none for a device of
  // another process). Throws ValueError naming the first mismatch.
  Array(Runtime runtime, Shape shape, DType dtype, NamedSharding sharding, std::vector<Shard> shards,
        std::string label = {});

  const Runtime& runtime() const { return s_->runtime; }
  const Shape& shape() const { return s_->shape; }
  DType dtype() const { return s_->dtype; }
  const NamedSharding& sharding() const { return s_->sharding; }
  const Mesh& mesh() const { return s_->sharding.mesh(); }
  // The name its memory is charged to ("params/w"); "" when created without one.
  const std::string& label() const { return s_->label; }
  // label(), or the type ("f32[16,8]") when there is none: what memory tables show.
  std::string display_name() const;

  std::span<const Shard> shards() const { return s_->shards; }
  const Shard& shard(int64_t device) const;  // throws ValueError if the device is not in the mesh
  std::vector<const Shard*> addressable_shards() const;
  bool is_fully_addressable() const;
  int64_t nbytes() const;  // of the global array
  std::string type_string() const { return tessel::type_string(dtype(), shape()); }

 private:
  friend class detail::ArrayBuilder;  // builds shards that are correct by construction
  struct State {
    Runtime runtime;
    Shape shape;
    DType dtype;
    NamedSharding sharding;
    std::vector<Shard> shards;
    std::string label;
  };
  explicit Array(std::shared_ptr<const State> state) : s_(std::move(state)) {}
  std::shared_ptr<const State> s_;
};

// Writes the row-major bytes of `box` into `out` (box.volume() * item size bytes).
using BoxFiller = std::function<void(const Box& box, std::span<std::byte> out)>;
using DeviceBoxFiller = std::function<void(int64_t device, const Box& box, std::span<std::byte> out)>;

// Copies to each addressable device exactly its Box of `host`. Throws ValueError if the mesh
// has devices the runtime lacks or the spec does not fit the shape.
Array device_put(const Runtime& rt, const HostArray& host, const NamedSharding& sharding,
                 std::string label = {});

// As JAX's make_array_from_callback: `fill` runs once per distinct block held by this process
// (possibly concurrently, on the worker pool), writing straight into the first holder's buffer;
// other local replicas are copied from it. No device ever sees more than its own block.
Array make_array_from_callback(const Runtime& rt, const Shape& shape, DType dtype,
                               const NamedSharding& sharding, const BoxFiller& fill,
                               std::string label = {});

// `fill` runs once per addressable device, so replicas may differ (per-device contributions,
// the input of a reduction).
Array make_array_from_device_callback(const Runtime& rt, const Shape& shape, DType dtype,
                                      const NamedSharding& sharding, const DeviceBoxFiller& fill,
                                      std::string label = {});

// As JAX's make_array_from_process_local_data: every process passes its part of the global array,
// `local`, which is the box its devices' blocks cover together (its rows of a batch sharded over
// the processes). `global_shape` defaults to local's shape times the number of parts each
// dimension has across processes. Throws ValueError when the process's blocks do not form one
// box of local's shape.
Array make_array_from_process_local_data(const Runtime& rt, const NamedSharding& sharding, const HostArray& local,
                                         std::optional<Shape> global_shape = std::nullopt, std::string label = {});

// The global array, assembled from replica 0 of every block. Throws ValueError when some block
// is held only by other processes: gather() it instead.
HostArray to_host(const Array& array);

// The global array on process `root`, nullopt on the others. Every process calls it; each block
// travels once, from its replica 0, to root, so only root ever holds the whole array.
std::optional<HostArray> gather(const Array& array, int root = 0);

}  // namespace tessel
