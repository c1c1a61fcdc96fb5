// Text views of the runtime for people: how an Array is laid out on its mesh, and what every
// device's memory holds.
//
//   std::cout << tessel::visualize(x);          // block grid labelled with devices
//   std::cout << tessel::memory_table(rt);      // per device: in use, peak, limit, holders
#pragma once

#include <string>

#include "tessel/runtime/array.h"
#include "tessel/runtime/runtime.h"

namespace tessel {

// "f32[16,8] params/w: NamedSharding(...)" then the sharding layer's picture.
std::string visualize(const Array& array);

// One row per device: bytes in use, peak, cached, limit, buffers and the largest holders.
std::string memory_table(const Runtime& rt);

}  // namespace tessel
