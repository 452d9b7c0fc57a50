#include "ops/op_common.h"

#include "common/error.h"
#include "device/devices.h"

namespace hvdtorch::ops {

std::string OpWhere::str() const {
  return strCat("rank ", engine.topo().rank, ": ", opTypeName(type), " '", name, "'");
}

ReduceOp toReduceOp(int value) {
  if (value < static_cast<int>(ReduceOp::kAverage) || value > static_cast<int>(ReduceOp::kProduct))
    throw InvalidArgument(strCat("unknown reduce op ", value, "; use Average, Sum, Min, Max or Product"));
  return static_cast<ReduceOp>(value);
}

std::shared_ptr<const ProcessSet> checkProcessSet(const OpWhere& where, int32_t process_set_id) {
  auto ps = where.engine.processSet(process_set_id);
  if (!ps)
    throw InvalidArgument(
        strCat(where.str(), ": process set ", process_set_id, " does not exist (never added, or removed)"));
  if (!ps->member()) throw InvalidArgument(strCat(where.str(), ": ", ps->describe(), " does not include this rank"));
  return ps;
}

TensorSpec specOf(const TensorBuffer& t) { return TensorSpec{t.dtype(), t.shape(), t.device().kind}; }

DeviceId checkOneDevice(const OpWhere& where, const std::vector<TensorPtr>& inputs,
                        const std::vector<TensorPtr>& outputs) {
  const TensorPtr* first = !inputs.empty() ? &inputs.front() : (!outputs.empty() ? &outputs.front() : nullptr);
  if (first == nullptr) return DeviceId{};
  const DeviceId dev = (*first)->device();
  auto check = [&](const std::vector<TensorPtr>& ts, const char* what) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i]->device() != dev)
        throw InvalidArgument(strCat(where.str(), ": ", what, " ", i, " is on ", ts[i]->device().str(),
                                     ", but the op's first tensor is on ", dev.str(),
                                     "; every tensor of one op must be on one device"));
  };
  check(inputs, "input");
  check(outputs, "output");
  try {
    deviceFor(dev);  // the build may lack the device, or CUDA may have no such ordinal
  } catch (const std::exception& e) {
    throw InvalidArgument(strCat(where.str(), ": ", e.what()));
  }
  return dev;
}

ReduceArgs reduceArgs(const OpWhere& where, ReduceOp op, double prescale, double postscale,
                      const std::vector<TensorPtr>& tensors) {
  for (const auto& t : tensors) {
    if (t->dtype() != DataType::kBool) continue;
    if (op == ReduceOp::kAverage)
      throw InvalidArgument(
          strCat(where.str(), ": Average is not defined for bool tensors; use Min (and) or Max (or)"));
    if (prescale != 1.0 || postscale != 1.0)
      throw InvalidArgument(strCat(where.str(), ": scale factors are not defined for bool tensors"));
  }
  ReduceArgs args;
  args.op = op;
  args.prescale = prescale;
  args.postscale = postscale;
  return args;
}

}  // namespace hvdtorch::ops
