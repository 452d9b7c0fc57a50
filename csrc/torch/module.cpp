// The Python extension hvdtorch._C: its errors and its parts. Each area's
// bindings live in bindings/ (bindings.h lists them); they convert types
// only and call the core, which holds every check and policy. Errors are
// translated here (CollectiveError -> hvdtorch.HvdError, a RuntimeError;
// InvalidArgument -> hvdtorch.InvalidArgumentError, both a ValueError and a
// RuntimeError; PassLimitError -> AssertionError).
#include <torch/extension.h>

#include "bindings/bindings.h"
#include "build_info.h"
#include "common/error.h"
#include "gradients/pass_counter.h"
#include "python_errors.h"
#include "tensor_binding.h"

namespace py = pybind11;
using namespace hvdtorch;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hvdtorch C++ core (engine, reducers, transports)";
  bindBuildInfo(m);
  installDeviceMakers();
  static py::exception<CollectiveError> hvd_error(m, "HvdError", PyExc_RuntimeError);
  setHvdErrorType(hvd_error.ptr());
  // Both bases: our contract says bad arguments raise ValueError; Horovod
  // raises its argument errors from the core as RuntimeError, which scripts
  // written for it catch.
  static py::exception<InvalidArgument> invalid_argument(
      m, "InvalidArgumentError", py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError)));
  setInvalidArgumentType(invalid_argument.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CollectiveError& e) {
      PyErr_SetString(hvd_error.ptr(), e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid_argument.ptr(), e.what());
    } catch (const PassLimitError& e) {
      PyErr_SetString(PyExc_AssertionError, e.what());  // Horovod's contract for an extra backward pass
    }
  });

  bindEngine(m);
  bindGradients(m);
  bindConfig(m);
  bindDevices(m);
  bindHostGather(m);
}
