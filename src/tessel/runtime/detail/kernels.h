// Internal (not installed): element loops over contiguous runs, dispatched on DType once per run.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessel/core/dtype.h"
#include "tessel/runtime/communicator.h"

namespace tessel::detail {

// dst[i] = op over k of inputs[k][i], i < count (see ReduceTask for the arithmetic). Throws
// ValueError for sum or mean of bool and mean of integers.
void reduce_run(DType dtype, Reduction op, const std::byte* const* inputs, size_t num_inputs,
                std::byte* dst, int64_t count);
void check_reduction(DType dtype, Reduction op);

// dst[i] = src[i] converted from `from` to `to`: floats round to nearest even (once, also from
// f64 to f16/bf16); float to integer truncates toward zero, saturates, and maps NaN to 0; to bool
// is "!= 0"; integer to integer wraps (as numpy's astype).
void convert_run(DType from, const std::byte* src, DType to, std::byte* dst, int64_t count);

// memcpy with non-temporal stores (x86-64; plain memcpy elsewhere): for targets that will not be
// read again soon, so the stores skip the read-for-ownership of each line and leave the cache to
// the sources. Call stream_fence() before another thread may read what was written.
void stream_copy(std::byte* dst, const std::byte* src, size_t bytes);
void stream_fence();

}  // namespace tessel::detail
