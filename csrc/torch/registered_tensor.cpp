#include "registered_tensor.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include "common/error.h"
#include "transport/shm/registered_memory.h"

namespace hvdtorch {

at::Tensor registeredZeros(Engine& engine, int64_t numel, at::ScalarType dtype) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  const auto& registered = engine.registered();
  if (!registered || numel <= 0) return at::zeros({numel}, options);
  std::shared_ptr<void> memory;
  try {
    memory = registered->allocate(static_cast<size_t>(numel) * c10::elementSize(dtype));
  } catch (const CollectiveError&) {
    return at::zeros({numel}, options);  // /dev/shm is full: the copy path works as well
  }
  void* data = memory.get();
  // The deleter owns the memory: the tensor (and its views) keep it alive.
  return at::from_blob(data, {numel}, [memory](void*) mutable { memory.reset(); }, options);
}

}  // namespace hvdtorch
