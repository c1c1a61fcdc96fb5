#include "convert.h"

#include "tessel/core/error.h"

namespace nb = nanobind;

namespace tessel::python {

std::string repr_of(nb::handle h) { return nb::repr(h).c_str(); }

DimSharding to_dim(nb::handle entry, const std::string& what) {
  if (entry.is_none()) return {};
  if (nb::isinstance<nb::str>(entry)) return {nb::cast<std::string>(entry)};
  if (nb::isinstance<nb::tuple>(entry) || nb::isinstance<nb::list>(entry)) {
    DimSharding axes;
    for (nb::handle axis : entry) {
      if (!nb::isinstance<nb::str>(axis)) {
        throw ValueError(what + ": a tuple of mesh axes holds " + repr_of(axis) +
                         ", not an axis name");
      }
      axes.push_back(nb::cast<std::string>(axis));
    }
    return axes;
  }
  throw ValueError(what + ": " + repr_of(entry) +
                   " is not None, a mesh axis name or a tuple of them");
}

nb::object from_dim(const DimSharding& dim) {
  if (dim.empty()) return nb::none();
  if (dim.size() == 1) return nb::str(dim.front().c_str());
  nb::list axes;
  for (const auto& a : dim) axes.append(nb::str(a.c_str()));
  return nb::tuple(axes);
}

Shape to_shape(nb::handle shape, const std::string& what) {
  if (!nb::isinstance<nb::tuple>(shape) && !nb::isinstance<nb::list>(shape)) {
    throw ValueError(what + " must be a tuple of ints, not " + repr_of(shape));
  }
  std::vector<int64_t> dims;
  for (nb::handle d : shape) {
    if (!nb::isinstance<nb::int_>(d) && !PyIndex_Check(d.ptr())) {
      throw ValueError(what + " must be a tuple of ints, not " + repr_of(shape));
    }
    dims.push_back(nb::cast<int64_t>(nb::int_(d)));
  }
  return Shape(std::move(dims));
}

nb::tuple from_shape(const Shape& shape) {
  nb::list dims;
  for (int64_t d : shape) dims.append(d);
  return nb::tuple(dims);
}

LogicalAxes to_logical(nb::handle names, const std::string& what) {
  if (nb::isinstance<nb::str>(names)) {
    throw ValueError(what + " must be a sequence of names (one per dimension), not the string " +
                     repr_of(names));
  }
  LogicalAxes out;
  for (nb::handle n : names) {
    if (n.is_none()) {
      out.emplace_back(std::nullopt);
    } else if (nb::isinstance<nb::str>(n)) {
      out.emplace_back(nb::cast<std::string>(n));
    } else {
      throw ValueError(what + ": " + repr_of(n) + " is not a logical axis name or None");
    }
  }
  return out;
}

nb::tuple from_logical(const LogicalAxes& names) {
  nb::list out;
  for (const auto& n : names) {
    if (n) out.append(nb::str(n->c_str()));
    else out.append(nb::none());
  }
  return nb::tuple(out);
}

nb::tuple to_slices(const Box& box) {
  nb::list out;
  for (size_t d = 0; d < box.rank(); ++d) out.append(nb::slice(nb::int_(box.start(d)), nb::int_(box.stop(d)), nb::none()));
  return nb::tuple(out);
}

nb::object from_partitioning(const Partitioning& p) {
  if (p.mesh_axes) return nb::cast(*p.mesh_axes);
  if (!p.logical.empty()) return from_logical(p.logical);
  return nb::none();
}

}  // namespace tessel::python
