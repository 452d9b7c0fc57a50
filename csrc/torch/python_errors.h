// Errors that leave hvdtorch through torch's autograd engine.
//
// Gradient hooks and the end-of-backward callback run inside loss.backward();
// the autograd engine carries their exceptions back to the caller, and torch
// turns every C++ exception it does not know into a plain RuntimeError, except
// a pending Python exception (pybind11::error_already_set), which it restores
// as it is. So code called by the autograd engine converts hvdtorch's errors
// with rethrowForAutograd(): a CollectiveError becomes hvdtorch.HvdError (and
// so HorovodInternalError), an InvalidArgument becomes
// hvdtorch.InvalidArgumentError (a ValueError and a RuntimeError), a
// PassLimitError (gradients/pass_counter.h) becomes AssertionError, exactly
// as on the direct path through the pybind module.
#pragma once

#include <exception>

struct _object;
typedef struct _object PyObject;

namespace hvdtorch {

// Called once by the module's initialisation with the HvdError type object.
void setHvdErrorType(PyObject* type);

// Called once by the module's initialisation with the InvalidArgumentError type object.
void setInvalidArgumentType(PyObject* type);

// Rethrows `error`, converted to a pending Python exception when it is one of
// hvdtorch's own; other exceptions pass unchanged.
[[noreturn]] void rethrowForAutograd(std::exception_ptr error);

}  // namespace hvdtorch
