// tessel's C++ exceptions as Python exceptions: tessel.Error (a RuntimeError) and its subclasses,
// each also a subclass of the matching built-in (ValueError, OSError, MemoryError), so
// `except ValueError` catches a bad argument as it would in any Python library.
#pragma once

#include <nanobind/nanobind.h>

namespace tessel::python {

// Creates the exception classes in `m` and registers the translator from C++.
void register_errors(nanobind::module_& m);

}  // namespace tessel::python
