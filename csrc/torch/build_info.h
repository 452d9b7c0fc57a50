// What this build of the extension holds, for hvdtorch.cuda_built(),
// nccl_built() and `python -m hvdtorch.check`: facts fixed when it was
// compiled (C++ standard, whether the core's CUDA device is linked in, the GPU
// architectures it was compiled for), plus the CUDA runtime's own count of
// visible devices and, when it is 0, its reason.
#pragma once

#include <pybind11/pybind11.h>

namespace hvdtorch {

// Adds _C.build_info() -> dict to the module.
void bindBuildInfo(pybind11::module_& m);

}  // namespace hvdtorch
