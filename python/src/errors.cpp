#include "errors.h"

#include <exception>

#include "tessel/core/error.h"

namespace nb = nanobind;

namespace tessel::python {
namespace {

struct Classes {
  PyObject* error = nullptr;
  PyObject* argument = nullptr;
  PyObject* sharding = nullptr;
  PyObject* parse = nullptr;
  PyObject* io = nullptr;
  PyObject* memory = nullptr;
};
Classes classes;  // created once at import; the module keeps them alive

PyObject* make_class(nb::module_& m, const char* name, const char* doc, nb::tuple bases) {
  const std::string qualified = std::string("tessel.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!cls) throw nb::python_error();
  m.attr(name) = nb::handle(cls);
  return cls;
}

}  // namespace

void register_errors(nb::module_& m) {
  nb::handle error_base(PyExc_RuntimeError);
  classes.error = make_class(m, "Error", "Base of every error tessel raises.", nb::make_tuple(error_base));
  nb::handle error(classes.error);
  classes.argument = make_class(m, "ArgumentError", "A value that breaks an invariant (a bad mesh, spec, shape or path).",
                                nb::make_tuple(error, nb::handle(PyExc_ValueError)));
  classes.sharding = make_class(m, "ShardingError",
                                "Logical axes that cannot give a valid sharding (a strict-mode conflict, an axis the mesh lacks).",
                                nb::make_tuple(error, nb::handle(PyExc_ValueError)));
  classes.parse = make_class(m, "ParseError", "Malformed text in a file or string; the message names the place.",
                             nb::make_tuple(error, nb::handle(PyExc_ValueError)));
  classes.io = make_class(m, "IoError", "A file that cannot be opened, read or written.",
                          nb::make_tuple(error, nb::handle(PyExc_OSError)));
  classes.memory = make_class(m, "OutOfMemoryError", "A device allocation over the device's memory limit.",
                              nb::make_tuple(error, nb::handle(PyExc_MemoryError)));

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tessel::ParseError& e) {
      PyErr_SetString(classes.parse, e.what());
    } catch (const tessel::ShardingError& e) {
      PyErr_SetString(classes.sharding, e.what());
    } catch (const tessel::ValueError& e) {
      PyErr_SetString(classes.argument, e.what());
    } catch (const tessel::IoError& e) {
      PyErr_SetString(classes.io, e.what());
    } catch (const tessel::OutOfMemoryError& e) {
      PyErr_SetString(classes.memory, e.what());
    } catch (const tessel::Error& e) {
      PyErr_SetString(classes.error, e.what());
    }
  });
}

}  // namespace tessel::python
