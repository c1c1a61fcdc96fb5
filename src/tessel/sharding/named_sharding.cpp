#include "tessel/sharding/named_sharding.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {

NamedSharding::NamedSharding(Mesh mesh, PartitionSpec spec)
    : mesh_(std::move(mesh)), spec_(std::move(spec)) {
  spec_.validate(mesh_, spec_.size());
  for (const DimSharding& axes : spec_.dims()) {
    std::vector<size_t> idx;
    for (const std::string& a : axes) idx.push_back(mesh_.axis_index(a));
    dim_axes_.push_back(std::move(idx));
  }
  for (size_t i = 0; i < mesh_.rank(); ++i) {
    bool used = std::any_of(dim_axes_.begin(), dim_axes_.end(), [&](const auto& idx) {
      return std::find(idx.begin(), idx.end(), i) != idx.end();
    });
    if (!used) replica_axes_.push_back(i);
  }
}

int64_t NamedSharding::num_blocks(size_t dim) const {
  int64_t k = 1;
  if (dim < dim_axes_.size())
    for (size_t a : dim_axes_[dim]) k *= mesh_.axes()[a].size;
  return k;
}

int64_t NamedSharding::block_index(const std::vector<int64_t>& coords, size_t dim) const {
  int64_t b = 0;
  if (dim < dim_axes_.size())
    for (size_t a : dim_axes_[dim]) b = b * mesh_.axes()[a].size + coords[a];
  return b;
}

void NamedSharding::check_rank(const Shape& shape) const {
  if (spec_.size() > shape.rank())
    throw ValueError(fmt::format("partition spec {} has {} entries but the array shape {} has rank {}",
                                 spec_.to_string(), spec_.size(), shape.to_string(), shape.rank()));
}

Shape NamedSharding::shard_shape(const Shape& shape) const {
  check_rank(shape);
  std::vector<int64_t> dims(shape.rank());
  for (size_t d = 0; d < shape.rank(); ++d) {
    int64_t k = num_blocks(d);
    dims[d] = (shape[d] + k - 1) / k;
  }
  return Shape(std::move(dims));
}

Box NamedSharding::block_box(const std::vector<int64_t>& coords, const Shape& block,
                             const Shape& shape) const {
  std::vector<int64_t> lo(shape.rank()), hi(shape.rank());
  for (size_t d = 0; d < shape.rank(); ++d) {
    int64_t b = block_index(coords, d);
    lo[d] = std::min(b * block[d], shape[d]);
    hi[d] = std::min(lo[d] + block[d], shape[d]);
  }
  return Box(std::move(lo), std::move(hi));
}

Box NamedSharding::device_box(int64_t device_id, const Shape& shape) const {
  return block_box(mesh_.coords(device_id), shard_shape(shape), shape);
}

std::vector<std::pair<int64_t, Box>> NamedSharding::devices_indices_map(const Shape& shape) const {
  Shape block = shard_shape(shape);
  std::vector<std::pair<int64_t, Box>> out;
  out.reserve(mesh_.device_ids().size());
  for (int64_t id : mesh_.device_ids()) out.emplace_back(id, block_box(mesh_.coords(id), block, shape));
  return out;
}

int64_t NamedSharding::replica_id(int64_t device_id) const {
  // Devices holding the same block differ only along the unused axes, and mesh order restricted
  // to them is row-major over those axes.
  std::vector<int64_t> coords = mesh_.coords(device_id);
  int64_t r = 0;
  for (size_t a : replica_axes_) r = r * mesh_.axes()[a].size + coords[a];
  return r;
}

int64_t NamedSharding::replica_id(int64_t device_id, const Shape& shape) const {
  check_rank(shape);
  std::vector<bool> replica(mesh_.rank(), false);
  for (size_t a : replica_axes_) replica[a] = true;
  bool empty_dim = false;
  for (size_t d = 0; d < dim_axes_.size(); ++d) {
    if (shape[d] != 0) continue;
    empty_dim = true;
    for (size_t a : dim_axes_[d]) replica[a] = true;
  }
  if (!empty_dim) return replica_id(device_id);
  const std::vector<int64_t> coords = mesh_.coords(device_id);
  int64_t r = 0;
  for (size_t a = 0; a < mesh_.rank(); ++a) {
    if (replica[a]) r = r * mesh_.axes()[a].size + coords[a];
  }
  return r;
}

std::vector<ShardPlacement> NamedSharding::distinct_shards(const Shape& shape) const {
  Shape block = shard_shape(shape);
  // Key: the block index along every dimension; map order is row-major block order.
  std::map<std::vector<int64_t>, ShardPlacement> blocks;
  for (int64_t id : mesh_.device_ids()) {
    std::vector<int64_t> coords = mesh_.coords(id);
    std::vector<int64_t> key(shape.rank());
    for (size_t d = 0; d < shape.rank(); ++d) key[d] = block_index(coords, d);
    auto [it, fresh] = blocks.try_emplace(std::move(key));
    if (fresh) it->second.box = block_box(coords, block, shape);
    it->second.devices.push_back(id);
  }
  std::vector<ShardPlacement> out;
  out.reserve(blocks.size());
  for (auto& [key, placement] : blocks) out.push_back(std::move(placement));
  return out;
}

bool NamedSharding::is_fully_replicated() const {
  for (size_t d = 0; d < dim_axes_.size(); ++d)
    if (num_blocks(d) > 1) return false;
  return true;
}

void NamedSharding::check_divisible(const Shape& shape, std::string_view what) const {
  check_rank(shape);
  for (size_t d = 0; d < spec_.size(); ++d) {
    int64_t k = num_blocks(d);
    if (shape[d] % k != 0)
      throw ValueError(fmt::format(
          "{}dimension {} of shape {} has size {}, not divisible by the {} blocks of mesh axes "
          "({}) in {}",
          text_util::what_prefix(what), d, shape.to_string(), shape[d], k,
          fmt::join(spec_[d], ", "), mesh_.to_string()));
  }
}

std::string NamedSharding::to_string() const {
  return fmt::format("NamedSharding(mesh={}, spec={})", mesh_.to_string(), spec_.to_string());
}

bool operator==(const NamedSharding& a, const NamedSharding& b) {
  if (!(a.mesh_ == b.mesh_)) return false;
  size_t n = std::max(a.spec_.size(), b.spec_.size());
  static const DimSharding kNone;
  for (size_t d = 0; d < n; ++d) {
    const DimSharding& x = d < a.spec_.size() ? a.spec_[d] : kNone;
    const DimSharding& y = d < b.spec_.size() ? b.spec_[d] : kNone;
    if (x != y) return false;
  }
  return true;
}

}  // namespace tessel
