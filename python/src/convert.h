// Conversions between Python values and tessel's value types, shared by the bindings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
// Every translation unit sees the same type casters: one without them would instantiate
// nb::cast<std::string> for a bound class, and the linker may keep that copy (std::bad_cast).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "tessel/core/box.h"
#include "tessel/core/shape.h"
#include "tessel/sharding/logical_rules.h"
#include "tessel/sharding/partition_spec.h"
#include "tessel/state/variable.h"

namespace tessel::python {

// Python's repr() of an object, for messages.
std::string repr_of(nanobind::handle h);

// One spec entry: None -> unsharded, "axis", or a tuple/list of axis names (major first).
// Throws ArgumentError naming `what` otherwise.
DimSharding to_dim(nanobind::handle entry, const std::string& what);
// The entry as JAX writes it: None, "axis" or ("a", "b").
nanobind::object from_dim(const DimSharding& dim);

// A shape from a tuple/list of non-negative ints.
Shape to_shape(nanobind::handle shape, const std::string& what = "shape");
nanobind::tuple from_shape(const Shape& shape);

// Logical axis names per dimension: each a str or None.
LogicalAxes to_logical(nanobind::handle names, const std::string& what = "logical_axes");
nanobind::tuple from_logical(const LogicalAxes& names);

// A variable's partitioning as Python sees it: its logical names (a tuple), its explicit mesh
// axes (a PartitionSpec), or None.
nanobind::object from_partitioning(const Partitioning& p);

// A Box as a tuple of slices (start, stop), JAX's index form.
nanobind::tuple to_slices(const Box& box);

}  // namespace tessel::python
