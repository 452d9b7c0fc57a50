#include "engine/op_payloads.h"

#include "algorithms/reducer_registry.h"

namespace hvdtorch {

void ReduceArgs::write(ByteWriter& w) const {
  w.put(op);
  w.put(prescale);
  w.put(postscale);
  w.put(reducer);
  w.put<uint8_t>(fuse);
}

ReduceArgs ReduceArgs::read(ByteReader& r) {
  ReduceArgs a;
  a.op = getEnum<ReduceOp>(r, static_cast<unsigned>(ReduceOp::kProduct) + 1, "reduce op");
  a.prescale = r.get<double>();
  a.postscale = r.get<double>();
  a.reducer = r.get<ReducerId>();
  if (a.reducer != kAutoReducer && a.reducer >= reducerRegistry().size())
    throw CollectiveError(strCat("corrupt control message (reducer ", int(a.reducer), ")"));
  a.fuse = r.get<uint8_t>() != 0;
  return a;
}

std::string ReduceArgs::mismatch(const ReduceArgs& y) const {
  const ReduceArgs& x = *this;
  if (x.op != y.op) return strCat("reduce op ", reduceOpName(x.op), " vs ", reduceOpName(y.op));
  if (x.prescale != y.prescale || x.postscale != y.postscale)
    return strCat("scale factors (prescale ", x.prescale, ", postscale ", x.postscale, ") vs (prescale ", y.prescale,
                  ", postscale ", y.postscale, ")");
  if (x.reducer != y.reducer) return strCat("reducer ", reducerName(x.reducer), " vs ", reducerName(y.reducer));
  if (x.fuse != y.fuse) return strCat("fusion ", x.fuse ? "on" : "off", " vs ", y.fuse ? "on" : "off");
  return "";
}

void ReduceArgs::describe(std::ostream& os) const { os << ", " << reduceOpName(op); }

namespace {

// The roots of two ranks' requests: empty when they agree.
std::string rootMismatch(int32_t a, int32_t b) { return a == b ? "" : strCat("root rank ", a, " vs ", b); }

}  // namespace

std::string BroadcastArgs::mismatch(const BroadcastArgs& other) const { return rootMismatch(root, other.root); }

std::string ReduceToRootArgs::mismatch(const ReduceToRootArgs& other) const {
  const std::string roots = rootMismatch(root, other.root);
  return roots.empty() ? reduce.mismatch(other.reduce) : roots;
}

void AlltoallArgs::describe(std::ostream& os) const {
  os << ", splits [";
  for (size_t i = 0; i < splits.size(); ++i) os << (i ? ", " : "") << splits[i];
  os << "]";
}

}  // namespace hvdtorch
