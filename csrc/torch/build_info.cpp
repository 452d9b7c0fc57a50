#include "build_info.h"

#include <string>

#ifdef HVDTORCH_HAVE_CUDA_DEVICE
#include "device/cuda_device.h"
#endif

namespace py = pybind11;

namespace hvdtorch {

void bindBuildInfo(py::module_& m) {
  m.def("build_info", [] {
    py::dict info;
    info["cxx_standard"] = HVDTORCH_CXX_STANDARD;
#ifdef HVDTORCH_WITH_CUDA
    info["torch_cuda"] = true;  // compiled against a CUDA build of torch
#else
    info["torch_cuda"] = false;
#endif
#ifdef USE_C10D_NCCL
    info["c10d_nccl"] = true;  // torch.distributed's NCCL process group is in the headers compiled against
#else
    info["c10d_nccl"] = false;
#endif
#ifdef HVDTORCH_HAVE_CUDA_DEVICE
    info["cuda_device"] = true;
    info["cuda_architectures"] = std::string(HVDTORCH_CUDA_ARCHITECTURES);
    info["cuda_compiler"] = std::string(HVDTORCH_CUDA_COMPILER_VERSION);
    std::string why;
    info["cuda_devices_visible"] = cudaDeviceCount(&why);
    info["cuda_devices_why_none"] = why;
#else
    info["cuda_device"] = false;
#endif
    return info;
  });
}

}  // namespace hvdtorch
