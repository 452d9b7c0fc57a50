// How the engine sees a framework tensor: a contiguous buffer with a dtype
// and shape, kept alive by whoever implements it (csrc/torch wraps
// at::Tensor). The engine never allocates framework memory itself; when an
// output's size is known only after negotiation (allgather, alltoall,
// reducescatter), it asks the entry's allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/dtype.h"

namespace hvdtorch {

class TensorBuffer {
 public:
  virtual ~TensorBuffer() = default;
  virtual void* data() = 0;
  virtual DataType dtype() const = 0;
  virtual std::vector<int64_t> shape() const = 0;
  virtual int64_t numel() const = 0;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtypeSize(dtype()); }
};

using TensorPtr = std::shared_ptr<TensorBuffer>;
using OutputAllocator = std::function<TensorPtr(DataType dtype, const std::vector<int64_t>& shape)>;

// Plain heap memory, for the C++ tests and for internal scratch.
class HostTensor : public TensorBuffer {
 public:
  HostTensor(DataType dtype, std::vector<int64_t> shape);
  void* data() override { return storage_.data(); }
  DataType dtype() const override { return dtype_; }
  std::vector<int64_t> shape() const override { return shape_; }
  int64_t numel() const override { return numel_; }

 private:
  DataType dtype_;
  std::vector<int64_t> shape_;
  int64_t numel_;
  std::vector<char> storage_;
};

}  // namespace hvdtorch
