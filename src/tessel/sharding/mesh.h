// A Mesh names the axes of an N-D grid of devices. Devices are laid out row-major over the axes
// in order (the last axis varies fastest), as in JAX.
//
//   auto mesh = tessel::Mesh::parse("data=2,fsdp=4");        // devices 0..7
//   mesh.coords(5) == std::vector<int64_t>{1, 1};
//   mesh.subgroups({"fsdp"})  // {{0,1,2,3}, {4,5,6,7}}: the devices an fsdp collective spans
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessel {

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  friend bool operator==(const MeshAxis&, const MeshAxis&) = default;
};

class Mesh {
 public:
  // Devices 0 .. product(sizes) - 1. Throws ValueError on an empty or repeated axis name, a size
  // below 1, or more than 2^20 devices.
  explicit Mesh(std::vector<MeshAxis> axes);
  // Explicit device ids, laid out row-major; their count must equal the product of the sizes.
  Mesh(std::vector<MeshAxis> axes, std::vector<int64_t> device_ids);

  // "data=2,fsdp=4". Throws ValueError naming the offending item.
  static Mesh parse(std::string_view text);
  // As parse(), in the axis order `declared` gives (MaxText's `mesh_axes`): declared axes the text
  // omits get size 1. Throws ValueError if the text names an undeclared axis or orders the axes
  // differently from `declared` (that would silently change the device layout).
  static Mesh parse(std::string_view text, std::span<const std::string> declared);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  std::vector<std::string> axis_names() const;
  size_t rank() const { return axes_.size(); }
  bool has_axis(std::string_view name) const;
  size_t axis_index(std::string_view name) const;  // throws ValueError naming the mesh's axes
  int64_t axis_size(std::string_view name) const;
  int64_t device_count() const { return static_cast<int64_t>(devices_->ids.size()); }
  const std::vector<int64_t>& device_ids() const { return devices_->ids; }

  bool contains(int64_t device_id) const;
  // Index of a device in device_ids() (row-major order); throws ValueError if it is not in the mesh.
  int64_t position(int64_t device_id) const;
  // Coordinates of a device along every axis; throws ValueError if the device is not in the mesh.
  std::vector<int64_t> coords(int64_t device_id) const;
  int64_t device_at(std::span<const int64_t> coords) const;
  // The devices that share all coordinates except those along `axes`, one group per combination
  // of the other coordinates (in row-major order); within a group devices are ordered row-major
  // over `axes` as listed (first = major). Every device is in exactly one group.
  std::vector<std::vector<int64_t>> subgroups(std::span<const std::string> axes) const;
  std::vector<std::vector<int64_t>> subgroups(std::initializer_list<std::string> axes) const {
    return subgroups(std::span<const std::string>(axes.begin(), axes.size()));
  }

  std::string to_string() const;  // "Mesh(data=2, fsdp=4)"
  friend bool operator==(const Mesh& a, const Mesh& b) {
    return a.axes_ == b.axes_ && (a.devices_ == b.devices_ || a.devices_->ids == b.devices_->ids);
  }

 private:
  // Shared between copies: every NamedSharding holds its Mesh, and an 8192-device abstract mesh
  // must not be copied per parameter.
  struct DeviceTable {
    std::vector<int64_t> ids;
    bool identity = false;                          // ids[i] == i: no map needed
    std::unordered_map<int64_t, int64_t> position;  // device id -> row-major position otherwise
  };
  std::vector<MeshAxis> axes_;
  std::shared_ptr<const DeviceTable> devices_;
};

}  // namespace tessel
