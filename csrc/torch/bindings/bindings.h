// The parts of the extension hvdtorch._C, one function per area, each
// adding its classes and functions to the module (module.cpp calls them in
// this order): the engine and its ops (bind_engine.cpp), the gradient core
// (bind_gradients.cpp), configuration and registries (bind_config.cpp), the
// device facts tests read (bind_devices.cpp), and shard=3's shared gathered
// buckets (bind_host_gather.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace hvdtorch {

void bindEngine(pybind11::module_& m);
void bindGradients(pybind11::module_& m);
void bindConfig(pybind11::module_& m);
void bindDevices(pybind11::module_& m);
void bindHostGather(pybind11::module_& m);

}  // namespace hvdtorch
