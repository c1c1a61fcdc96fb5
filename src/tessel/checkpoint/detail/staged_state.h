// Internal (not installed): what a StagedState holds, for the writers of every format.
#pragma once

#include <cstdint>
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
  std::vector<std::vector<std::byte>> owned;  // the host copies the blocks point into (staged)
  std::vector<Array> held;                    // or the arrays themselves (synchronous save)
  int64_t bytes = 0;
};

}  // namespace tessel
