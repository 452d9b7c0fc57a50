#include "ops/op_common.h"

#include <algorithm>

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

OpEntry::OpEntry(Engine& engine, OpType type, std::string& name, int32_t process_set_id)
    : engine_(engine), name_(name), where_{engine, type, name}, process_set_id_(process_set_id) {
  set_ = checkProcessSet(where_, process_set_id);
}

OpEntry::OpEntry(Engine& engine, OpType type, std::string& name)
    : engine_(engine), name_(name), where_{engine, type, name} {}

void OpEntry::needRows(const std::vector<TensorPtr>& inputs) const {
  if (inputs.empty()) fail("needs at least one tensor");
  for (const auto& t : inputs)
    if (t->shape().empty()) fail("tensors need at least one dimension");
}

int32_t OpEntry::rootInSet(int root_rank) const {
  const ProcessSet& ps = processSet();
  const auto at = std::find(ps.ranks.begin(), ps.ranks.end(), root_rank);
  if (at == ps.ranks.end()) {
    if (ps.id == 0) fail("root_rank ", root_rank, " is not a rank in [0, ", engine_.topo().size, ")");
    fail("root_rank ", root_rank, " is not in ", ps.describe());
  }
  return static_cast<int32_t>(at - ps.ranks.begin());
}

void OpEntry::outputLikeInput(const TensorBuffer& input, const TensorBuffer& output) const {
  if (input.numel() != output.numel() || input.dtype() != output.dtype()) fail("output does not match the input");
}

int64_t OpEntry::submit(std::vector<TensorPtr> inputs, std::vector<TensorPtr> outputs, OutputAllocator allocate,
                        OpArgs args) {
  if (!allocate && opSpec(where_.type).outputs == Outputs::kAllocated) fail("needs an output allocator");
  checkOneDevice(where_, inputs, outputs);
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = where_.type;
  q.process_set_id = process_set_id_;
  q.tensors.reserve(inputs.size());
  for (const auto& t : inputs) q.tensors.push_back(specOf(*t));
  q.args = std::move(args);
  q.name = std::move(name_);
  e->inputs = std::move(inputs);
  e->outputs = std::move(outputs);
  e->allocate = std::move(allocate);
  return engine_.submit(std::move(e));
}

}  // namespace hvdtorch::ops
