// Element type conversion of a whole Array, shard by shard on the devices (no data moves
// between devices; the sharding is kept).
//
//   tessel::Array w16 = tessel::cast(w, tessel::DType::kBF16);   // round to nearest even
//
// Floats round to nearest even, once (f64 -> bf16 too); NaN stays NaN. Float to integer
// truncates toward zero, saturates and maps NaN to 0; anything to bool is "!= 0"; integer to
// integer wraps, as numpy's astype.
#pragma once

#include "tessel/core/dtype.h"
#include "tessel/runtime/array.h"

namespace tessel {

Array cast(const Array& x, DType dtype);

}  // namespace tessel
