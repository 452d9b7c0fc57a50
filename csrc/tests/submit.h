// Submitting float32 ops to an in-process engine through the op entry
// functions (csrc/core/ops), as the Python layer does, and reading results:
// what the engine tests that need plain all-reduces share.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/tensor.h"
#include "ops/allreduce.h"

namespace hvdtorch::test {

inline TensorPtr floats(std::vector<float> v) {
  auto t = std::make_shared<HostTensor>(DataType::kFloat32, std::vector<int64_t>{static_cast<int64_t>(v.size())});
  std::memcpy(t->data(), v.data(), v.size() * sizeof(float));
  return t;
}

inline std::vector<float> valuesOf(const TensorPtr& t) {
  const float* p = static_cast<const float*>(t->data());
  return std::vector<float>(p, p + t->numel());
}

// Waits for the op (at most `limit`) and returns its error ("" on success,
// "did not finish" when it did not); releases the handle once finished.
inline std::string finish(Engine& eng, int64_t h, std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  auto st = eng.state(h);
  if (!st->waitFor(limit)) return "did not finish";
  const std::string err = st->error();
  eng.release(h);
  return err;
}

// A Sum all-reduce of `t` in place, in process set `set`.
inline int64_t sumOf(Engine& eng, const std::string& name, const TensorPtr& t, int32_t set = 0) {
  ops::AllreduceOptions o;
  o.name = name;
  o.inputs = {t};
  o.outputs = {t};
  o.op = ReduceOp::kSum;
  o.process_set_id = set;
  return ops::allreduce(eng, std::move(o));
}

}  // namespace hvdtorch::test
