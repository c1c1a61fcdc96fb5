#include "tessel/runtime/cast.h"

#include "tessel/runtime/detail/array_builder.h"
#include "tessel/runtime/detail/kernels.h"
#include "tessel/runtime/worker_pool.h"

namespace tessel {

Array cast(const Array& x, DType dtype) {
  if (dtype == x.dtype()) return x;
  detail::ArrayBuilder b(x.runtime(), x.shape(), dtype, x.sharding(), x.label());
  b.allocate_all();
  x.runtime().pool().parallel_for(static_cast<int64_t>(b.size()), [&](int64_t k) {
    auto i = static_cast<size_t>(k);
    if (!b.addressable(i)) return;
    const Shard& s = x.shards()[i];
    detail::convert_run(x.dtype(), s.buffer.data(), dtype, b.data(i), s.box.volume());
  });
  return std::move(b).finish();
}

}  // namespace tessel
