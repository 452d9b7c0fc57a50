#include "python_errors.h"

#include <pybind11/pybind11.h>

#include "common/error.h"
#include "gradients/pass_counter.h"

namespace hvdtorch {

namespace {
PyObject* hvd_error_type = nullptr;
PyObject* invalid_argument_type = nullptr;
}  // namespace

void setHvdErrorType(PyObject* type) { hvd_error_type = type; }

void setInvalidArgumentType(PyObject* type) { invalid_argument_type = type; }

void rethrowForAutograd(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveError& e) {
    pybind11::gil_scoped_acquire gil;
    PyErr_SetString(hvd_error_type ? hvd_error_type : PyExc_RuntimeError, e.what());
    throw pybind11::error_already_set();
  } catch (const InvalidArgument& e) {
    pybind11::gil_scoped_acquire gil;
    PyErr_SetString(invalid_argument_type ? invalid_argument_type : PyExc_ValueError, e.what());
    throw pybind11::error_already_set();
  } catch (const PassLimitError& e) {
    pybind11::gil_scoped_acquire gil;
    PyErr_SetString(PyExc_AssertionError, e.what());  // Horovod's contract for an extra backward pass
    throw pybind11::error_already_set();
  }
}

}  // namespace hvdtorch
