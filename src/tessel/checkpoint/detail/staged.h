// Internal (not installed): the blocks a save writes, taken from device arrays (in place, or
// copied to host memory for a save in the background) or from a caller's host memory; what a
// StagedState holds.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/process_group.h"
#include "tessel/runtime/runtime.h"
#include "tessel/state/variable.h"

namespace tessel::detail {

struct BlockBytes {
  Box box;
  std::span<const std::byte> bytes;
};

// The blocks of `array` this process writes: for each distinct block, the first holder this
// process owns, when that holder is replica 0 (in one process: every distinct block, once).
std::vector<BlockBytes> blocks_to_write(const Array& array);

struct StagedLeaves {
  // A block's host copy; from 1 MiB on a page boundary, so that a durable save can write it to
  // the disk directly (File::enable_direct_writes), as it does a device's block.
  struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using HostCopy = std::unique_ptr<std::byte[], FreeBytes>;
  static HostCopy copy_of(std::span<const std::byte> bytes);
  struct Leaf {
    std::string path;
    std::string kind;
    Partitioning partitioning;
    Shape shape;
    DType dtype = DType::kF32;
    NamedSharding sharding;
    std::vector<BlockBytes> blocks;  // this process's
  };
  std::vector<Leaf> leaves;
  std::optional<Runtime> runtime;  // of the arrays; none for an empty state or host leaves
  ProcessGroup* group = nullptr;   // host leaves of a job's processes (HostProcesses)
  std::vector<HostCopy> owned;     // the host copies the blocks point into (staged)
  std::vector<Array> held;         // or the arrays themselves (a save in place)
  int64_t bytes = 0;
};

}  // namespace tessel::detail
