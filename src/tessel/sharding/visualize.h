// Text picture of how a NamedSharding splits an array: a grid of blocks labelled with the devices
// that hold them. 1-D arrays are one row; 2-D arrays a rows x columns grid; for N-D arrays the
// grid is drawn over the last two sharded dimensions, once per block of the other sharded ones
// (JAX and DTensor stop at 2-D).
//
//   std::cout << tessel::visualize(tessel::NamedSharding(mesh, {{"fsdp"}, {"tensor"}}), {16, 8});
#pragma once

#include <string>

#include "tessel/core/shape.h"
#include "tessel/sharding/named_sharding.h"

namespace tessel {

std::string visualize(const NamedSharding& sharding, const Shape& shape);

}  // namespace tessel
