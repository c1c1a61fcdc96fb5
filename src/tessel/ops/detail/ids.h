// Internal: integer index tensors (token ids, labels) read by the ops that look rows up by them.
#pragma once

#include <cstdint>

#include "tessel/ops/tensor.h"

namespace tessel::ops::detail {

// Throws ValueError unless ids are i32 or i64 and not a partial sum.
void check_ids(const Tensor& ids, const char* op);
// Element i of the ids' block on `device`.
int64_t id_at(const Tensor& ids, int64_t device, int64_t i);
// Throws ValueError naming the op, the index and the valid range [0, size).
[[noreturn]] void bad_id(const char* op, int64_t id, int64_t size);

}  // namespace tessel::ops::detail
