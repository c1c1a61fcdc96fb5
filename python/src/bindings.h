// The parts of the extension module tessel._tessel, one per layer they expose.
#pragma once

#include <nanobind/nanobind.h>

namespace tessel::python {

void bind_sharding(nanobind::module_& m);    // Mesh, PartitionSpec, NamedSharding, LogicalRules
void bind_checkpoint(nanobind::module_& m);  // save, restore, items, info, verify (flat records)
void bind_state(nanobind::module_& m);       // model configs, eval_shape, memory plans

}  // namespace tessel::python
