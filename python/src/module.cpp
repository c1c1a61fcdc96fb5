// tessel._tessel: the compiled core of the Python package (see python/tessel/__init__.py).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include "bindings.h"
#include "errors.h"
#include "tessel/core/path.h"

NB_MODULE(_tessel, m) {
  m.doc() = "tessel's C++ core: meshes, shardings, logical axis rules, model state and checkpoints";
  tessel::python::register_errors(m);
  m.def(
      "local_path", [](std::string_view text, std::string_view what) { return tessel::local_path(text, what).string(); },
      nanobind::arg("text"), nanobind::arg("what"),
      "`text` as a local path (file:///p is p); any other URL raises ArgumentError naming `what`.");
  m.def("url_scheme", &tessel::url_scheme, nanobind::arg("text"), "The URL scheme `text` starts with, or ''.");
  tessel::python::bind_sharding(m);
  tessel::python::bind_checkpoint(m);
  tessel::python::bind_state(m);
}
