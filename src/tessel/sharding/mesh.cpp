#include "tessel/sharding/mesh.h"

#include <algorithm>
#include <charconv>
#include <numeric>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessel/core/error.h"
#include "tessel/detail/text_util.h"

namespace tessel {
namespace {

// Far above any real mesh; keeps a typo such as "fsdp=1000000000" from allocating gigabytes.
constexpr int64_t kMaxMeshDevices = int64_t{1} << 20;

int64_t checked_device_count(const std::vector<MeshAxis>& axes) {
  int64_t n = 1;
  for (size_t i = 0; i < axes.size(); ++i) {
    const MeshAxis& a = axes[i];
    if (a.name.empty()) throw ValueError(fmt::format("mesh axis {} has an empty name", i));
    for (size_t j = 0; j < i; ++j)
      if (axes[j].name == a.name)
        throw ValueError(fmt::format("mesh axis '{}' appears twice (positions {} and {})", a.name, j, i));
    if (a.size < 1)
      throw ValueError(fmt::format("mesh axis '{}' has size {}; sizes must be >= 1", a.name, a.size));
    if (__builtin_mul_overflow(n, a.size, &n) || n > kMaxMeshDevices)
      throw ValueError(fmt::format("mesh has more than {} devices (the most tessel supports)", kMaxMeshDevices));
  }
  return n;
}

std::vector<int64_t> iota_devices(const std::vector<MeshAxis>& axes) {
  std::vector<int64_t> ids(static_cast<size_t>(checked_device_count(axes)));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

std::vector<MeshAxis> parse_axes(std::string_view text) {
  using text_util::trim;
  if (trim(text).empty())
    throw ValueError("mesh '' is empty: expected axis=size pairs such as data=2,fsdp=4");
  std::vector<MeshAxis> axes;
  for (std::string_view item : text_util::split_commas(trim(text))) {
    size_t eq = item.find('=');
    if (eq == item.npos)
      throw ValueError(fmt::format("mesh '{}': item '{}' is not axis=size", text, item));
    std::string_view name = trim(item.substr(0, eq));
    std::string_view size_text = trim(item.substr(eq + 1));
    if (name.empty())
      throw ValueError(fmt::format("mesh '{}': item '{}' has an empty axis name", text, item));
    int64_t size = 0;
    auto [end, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
    if (size_text.empty() || ec != std::errc() || end != size_text.data() + size_text.size())
      throw ValueError(fmt::format("mesh '{}': axis '{}' has size '{}', not an integer", text,
                                   name, size_text));
    axes.push_back({std::string(name), size});
  }
  return axes;
}

}  // namespace

Mesh::Mesh(std::vector<MeshAxis> axes) : Mesh(axes, iota_devices(axes)) {}

Mesh::Mesh(std::vector<MeshAxis> axes, std::vector<int64_t> device_ids) : axes_(std::move(axes)) {
  int64_t n = checked_device_count(axes_);
  if (static_cast<int64_t>(device_ids.size()) != n)
    throw ValueError(fmt::format("mesh {} needs {} devices but {} device ids were given",
                                 to_string(), n, device_ids.size()));
  auto table = std::make_shared<DeviceTable>();
  table->identity = true;
  for (size_t i = 0; i < device_ids.size(); ++i) table->identity &= device_ids[i] == static_cast<int64_t>(i);
  if (!table->identity) {
    table->position.reserve(device_ids.size());
    for (size_t i = 0; i < device_ids.size(); ++i) {
      if (device_ids[i] < 0)
        throw ValueError(fmt::format("mesh device id {} at position {} is negative", device_ids[i], i));
      if (!table->position.emplace(device_ids[i], static_cast<int64_t>(i)).second)
        throw ValueError(fmt::format("mesh device id {} appears twice", device_ids[i]));
    }
  }
  table->ids = std::move(device_ids);
  devices_ = std::move(table);
}

Mesh Mesh::parse(std::string_view text) { return Mesh(parse_axes(text)); }

Mesh Mesh::parse(std::string_view text, std::span<const std::string> declared) {
  std::vector<MeshAxis> given = parse_axes(text);
  if (declared.empty()) return Mesh(std::move(given));
  std::vector<MeshAxis> axes;
  for (const std::string& name : declared) axes.push_back({name, 1});
  checked_device_count(axes);  // declared names must be unique and non-empty too
  size_t last = 0;
  for (size_t i = 0; i < given.size(); ++i) {
    auto it = std::find(declared.begin(), declared.end(), given[i].name);
    if (it == declared.end())
      throw ValueError(fmt::format("mesh '{}': axis '{}' is not among the declared mesh_axes [{}]",
                                   text, given[i].name, fmt::join(declared, ", ")));
    size_t at = static_cast<size_t>(it - declared.begin());
    if (i > 0 && at <= last)
      throw ValueError(fmt::format(
          "mesh '{}': axis '{}' comes after '{}' here but before it in mesh_axes [{}]; list the "
          "axes in mesh_axes order",
          text, given[i].name, given[i - 1].name, fmt::join(declared, ", ")));
    last = at;
    axes[at].size = given[i].size;
  }
  return Mesh(std::move(axes));
}

std::vector<std::string> Mesh::axis_names() const {
  std::vector<std::string> names;
  for (const auto& a : axes_) names.push_back(a.name);
  return names;
}

bool Mesh::has_axis(std::string_view name) const {
  return std::any_of(axes_.begin(), axes_.end(), [&](const MeshAxis& a) { return a.name == name; });
}

size_t Mesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].name == name) return i;
  throw ValueError(fmt::format("mesh {} has no axis '{}'", to_string(), name));
}

int64_t Mesh::axis_size(std::string_view name) const { return axes_[axis_index(name)].size; }

bool Mesh::contains(int64_t device_id) const {
  if (devices_->identity) return device_id >= 0 && device_id < device_count();
  return devices_->position.count(device_id) != 0;
}

int64_t Mesh::position(int64_t device_id) const {
  if (devices_->identity && device_id >= 0 && device_id < device_count()) return device_id;
  auto it = devices_->position.find(device_id);
  if (devices_->identity || it == devices_->position.end())
    throw ValueError(fmt::format("device {} is not in mesh {}", device_id, to_string()));
  return it->second;
}

std::vector<int64_t> Mesh::coords(int64_t device_id) const {
  std::vector<int64_t> c(axes_.size());
  int64_t p = position(device_id);
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = p % axes_[i].size;
    p /= axes_[i].size;
  }
  return c;
}

int64_t Mesh::device_at(std::span<const int64_t> coords) const {
  if (coords.size() != axes_.size())
    throw ValueError(fmt::format("mesh {} has {} axes but {} coordinates were given", to_string(),
                                 axes_.size(), coords.size()));
  int64_t p = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].size)
      throw ValueError(fmt::format("coordinate {} is outside mesh axis '{}' of size {}", coords[i],
                                   axes_[i].name, axes_[i].size));
    p = p * axes_[i].size + coords[i];
  }
  return devices_->ids[static_cast<size_t>(p)];
}

std::vector<std::vector<int64_t>> Mesh::subgroups(std::span<const std::string> axes) const {
  std::vector<size_t> inner;  // indices of the group axes, in the order given
  for (const std::string& name : axes) {
    size_t i = axis_index(name);
    if (std::find(inner.begin(), inner.end(), i) != inner.end())
      throw ValueError(fmt::format("mesh axis '{}' is listed twice for a subgroup", name));
    inner.push_back(i);
  }
  std::vector<size_t> outer;
  for (size_t i = 0; i < axes_.size(); ++i)
    if (std::find(inner.begin(), inner.end(), i) == inner.end()) outer.push_back(i);

  auto count = [&](const std::vector<size_t>& idx) {
    int64_t n = 1;
    for (size_t i : idx) n *= axes_[i].size;
    return n;
  };
  // Fill `c` at positions `idx` with the row-major digits of `k`.
  auto spread = [&](int64_t k, const std::vector<size_t>& idx, std::vector<int64_t>& c) {
    for (size_t j = idx.size(); j-- > 0;) {
      c[idx[j]] = k % axes_[idx[j]].size;
      k /= axes_[idx[j]].size;
    }
  };
  std::vector<std::vector<int64_t>> groups(static_cast<size_t>(count(outer)));
  std::vector<int64_t> c(axes_.size(), 0);
  for (int64_t g = 0; g < count(outer); ++g) {
    spread(g, outer, c);
    auto& group = groups[static_cast<size_t>(g)];
    for (int64_t k = 0; k < count(inner); ++k) {
      spread(k, inner, c);
      group.push_back(device_at(c));
    }
  }
  return groups;
}

std::string Mesh::to_string() const {
  std::string out = "Mesh(";
  for (size_t i = 0; i < axes_.size(); ++i)
    out += fmt::format("{}{}={}", i ? ", " : "", axes_[i].name, axes_[i].size);
  return out + ")";
}

}  // namespace tessel
