// Tensors in registered memory (transport/shm/registered_memory.h): the node
// reducer reduces them in place, with no copy through the node arena.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "engine/engine.h"

namespace hvdtorch {

// A zero-filled 1-D CPU tensor of `numel` elements of `dtype` in the engine's
// registered memory; a plain at::zeros where there is none (shared memory
// off, one rank on the host) or where /dev/shm cannot hold it.
at::Tensor registeredZeros(Engine& engine, int64_t numel, at::ScalarType dtype);

}  // namespace hvdtorch
