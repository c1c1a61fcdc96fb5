// Internal (not installed): what a StagedState holds, for the writers of every format.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessel/checkpoint/checkpointer.h"
#include "tessel/core/box.h"
#include "tessel/runtime/array.h"
#include "tessel/runtime/runtime.h"

namespace tessel {

struct StagedState::Impl {
  // A block's host copy; from 1 MiB on a page boundary, so that a durable save can write it to
  // the disk directly (File::enable_direct_writes), as it does a device's block.
  struct FreeBytes {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using HostCopy = std::unique_ptr<std::byte[], FreeBytes>;
  static HostCopy copy_of(std::span<const std::byte> bytes);
  struct Block {
    Box box;
    std::span<const std::byte> bytes;
  };
  struct Param {
    std::string path;
    std::string kind;
    Partitioning partitioning;
    Shape shape;
    DType dtype = DType::kF32;
    NamedSharding sharding;
    std::vector<Block> blocks;  // this process's replica-0 blocks
  };
  std::vector<Param> params;
  std::optional<Runtime> runtime;             // of the arrays; none for an empty state
  std::vector<HostCopy> owned;                // the host copies the blocks point into (staged)
  std::vector<Array> held;                    // or the arrays themselves (synchronous save)
  int64_t bytes = 0;
};

}  // namespace tessel
