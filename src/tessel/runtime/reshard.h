// Resharding moves an Array to another NamedSharding (another spec, or another mesh over the same
// devices). Each target shard is assembled from its intersections with the source blocks; a part
// the target device already holds is copied locally (or the whole buffer is shared when the boxes
// are equal), and every other part comes from one source replica, the least loaded sender. So the
// bytes copied across devices are the lower bound: the target bytes not already on the device.
//
//   tessel::ReshardPlan plan(x.sharding(), columns, x.shape(), x.dtype());
//   std::cout << plan.to_string();           // per device: local, received, from whom
//   tessel::Array y = tessel::reshard(x, columns);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tessel/core/box.h"
#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/runtime/array.h"
#include "tessel/sharding/named_sharding.h"

namespace tessel {

// One piece of a reshard: `region` (global coordinates) from src_device's source shard into
// dst_device's target shard. src_device == dst_device is a local copy.
struct Transfer {
  int64_t src_device = 0;
  int64_t dst_device = 0;
  Box region;
};

struct DeviceTraffic {
  int64_t device = 0;
  int64_t bytes_local = 0;     // target bytes this device already holds
  int64_t bytes_received = 0;  // target bytes copied here from other devices
  int64_t bytes_sent = 0;      // bytes this device sends to others
  std::map<int64_t, int64_t> received_from;  // source device -> bytes
};

class ReshardPlan {
 public:
  // Throws ValueError if either spec does not fit the shape.
  ReshardPlan(const NamedSharding& source, const NamedSharding& target, const Shape& shape,
              DType dtype);

  // Grouped by target device in target mesh order.
  const std::vector<Transfer>& transfers() const { return transfers_; }
  // Every device of the target mesh (mesh order), then source-only devices.
  const std::vector<DeviceTraffic>& devices() const { return devices_; }
  const DeviceTraffic& device(int64_t id) const;  // throws ValueError if not in the plan
  int64_t bytes_received() const;  // total across devices
  int64_t bytes_local() const;
  std::string to_string() const;

 private:
  std::string header_;
  std::vector<Transfer> transfers_;
  std::vector<DeviceTraffic> devices_;
};

ReshardPlan plan_reshard(const Array& array, const NamedSharding& target);

// The same global value under `target`. Device buffers whose box is unchanged are shared, not
// copied, so resharding to an equal sharding copies nothing.
Array reshard(const Array& array, const NamedSharding& target);

}  // namespace tessel
