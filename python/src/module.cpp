// tessel._tessel: the compiled core of the Python package (see python/tessel/__init__.py).
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "errors.h"

NB_MODULE(_tessel, m) {
  m.doc() = "tessel's C++ core: meshes, shardings, logical axis rules, model state and checkpoints";
  tessel::python::register_errors(m);
  tessel::python::bind_sharding(m);
  tessel::python::bind_checkpoint(m);
  tessel::python::bind_state(m);
}
