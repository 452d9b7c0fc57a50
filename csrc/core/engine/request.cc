#include "engine/request.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "algorithms/reducer_registry.h"

namespace hvdtorch {

const char* opTypeName(OpType t) {
  switch (t) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kBarrier: return "barrier";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kJoin: return "join";
  }
  return "unknown";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t argsIndexFor(OpType t) {
  switch (t) {
    case OpType::kAllreduce:
    case OpType::kReducescatter: return 1;  // ReduceArgs
    case OpType::kBroadcast: return 2;      // BroadcastArgs
    case OpType::kAlltoall: return 3;       // AlltoallArgs
    case OpType::kAllgather:
    case OpType::kBarrier:
    case OpType::kJoin: break;
  }
  return 0;
}

size_t planIndexFor(OpType t) {
  switch (t) {
    case OpType::kAllgather: return 1;      // AllgatherPlan
    case OpType::kAlltoall: return 2;       // AlltoallPlan
    case OpType::kReducescatter: return 3;  // ReducescatterPlan
    case OpType::kJoin: return 4;           // JoinPlan
    default: return 0;
  }
}

namespace {

std::string shapeStr(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

// An enum stored as one byte, checked against its number of values.
template <typename E>
E getEnum(ByteReader& r, unsigned count, const char* what) {
  const auto v = r.get<uint8_t>();
  if (v >= count) throw CollectiveError(strCat("corrupt control message (", what, " ", unsigned(v), ")"));
  return static_cast<E>(v);
}

OpType getOpType(ByteReader& r) { return getEnum<OpType>(r, static_cast<unsigned>(OpType::kJoin) + 1, "op type"); }

// Allgather and alltoall let the first dimension differ across ranks.
bool firstDimMayDiffer(OpType t) { return t == OpType::kAllgather || t == OpType::kAlltoall; }

}  // namespace

void Request::write(ByteWriter& w) const {
  w.put(type);
  w.putString(name);
  w.put(process_set_id);
  w.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    w.put(t.dtype);
    w.putVector(t.shape);
  }
  if (args.index() != argsIndexFor(type))
    throw InvalidArgument(strCat(opTypeName(type), " '", name, "': request carries the wrong payload"));
  switch (argsIndexFor(type)) {
    case 1: {
      const ReduceArgs& a = reduce();
      w.put(a.op);
      w.put(a.prescale);
      w.put(a.postscale);
      w.put(a.reducer);
      w.put<uint8_t>(a.fuse);
      break;
    }
    case 2: w.put(broadcast().root); break;
    case 3: w.putVector(alltoall().splits); break;
    default: break;
  }
}

Request Request::read(ByteReader& r) {
  Request q;
  q.type = getOpType(r);
  q.name = r.getString();
  q.process_set_id = r.get<int32_t>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    TensorSpec t;
    t.dtype = getEnum<DataType>(r, static_cast<unsigned>(DataType::kBool) + 1, "dtype");
    t.shape = r.getVector<int64_t>();
    q.tensors.push_back(std::move(t));
  }
  switch (argsIndexFor(q.type)) {
    case 1: {
      ReduceArgs a;
      a.op = getEnum<ReduceOp>(r, static_cast<unsigned>(ReduceOp::kProduct) + 1, "reduce op");
      a.prescale = r.get<double>();
      a.postscale = r.get<double>();
      a.reducer = r.get<ReducerId>();
      if (a.reducer != kAutoReducer && a.reducer >= reducerRegistry().size())
        throw CollectiveError(strCat("corrupt control message (reducer ", int(a.reducer), ")"));
      a.fuse = r.get<uint8_t>() != 0;
      q.args = a;
      break;
    }
    case 2: q.args = BroadcastArgs{r.get<int32_t>()}; break;
    case 3: q.args = AlltoallArgs{r.getVector<int64_t>()}; break;
    default: break;
  }
  return q;
}

std::string Request::signatureMismatch(const Request& a, const Request& b) {
  if (a.type != b.type) return strCat("operation ", opTypeName(a.type), " vs ", opTypeName(b.type));
  if (a.process_set_id != b.process_set_id) return strCat("process set ", a.process_set_id, " vs ", b.process_set_id);
  if (a.tensors.size() != b.tensors.size())
    return strCat("group of ", a.tensors.size(), " tensors vs ", b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    const std::string which = a.tensors.size() > 1 ? strCat(" (tensor ", i, " of the group)") : "";
    if (x.dtype != y.dtype) return strCat("dtype ", dtypeName(x.dtype), " vs ", dtypeName(y.dtype), which);
    if (firstDimMayDiffer(a.type)) {
      if (x.shape.empty() || y.shape.empty() || x.shape.size() != y.shape.size() ||
          !std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1))
        return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape), " (", opTypeName(a.type),
                      " allows only the first dimension to differ)", which);
    } else if (x.shape != y.shape) {
      return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape), which);
    }
  }
  if (a.type == OpType::kAllreduce || a.type == OpType::kReducescatter) {
    const ReduceArgs& x = a.reduce();
    const ReduceArgs& y = b.reduce();
    if (x.op != y.op) return strCat("reduce op ", reduceOpName(x.op), " vs ", reduceOpName(y.op));
    if (x.prescale != y.prescale || x.postscale != y.postscale)
      return strCat("scale factors (prescale ", x.prescale, ", postscale ", x.postscale, ") vs (prescale ", y.prescale,
                    ", postscale ", y.postscale, ")");
    if (x.reducer != y.reducer) return strCat("reducer ", reducerName(x.reducer), " vs ", reducerName(y.reducer));
    if (x.fuse != y.fuse) return strCat("fusion ", x.fuse ? "on" : "off", " vs ", y.fuse ? "on" : "off");
  }
  if (a.type == OpType::kBroadcast && a.broadcast().root != b.broadcast().root)
    return strCat("root rank ", a.broadcast().root, " vs ", b.broadcast().root);
  return "";
}

std::string Request::describe() const {
  std::ostringstream os;
  os << opTypeName(type) << " '" << name << "'";
  if (type == OpType::kBarrier || type == OpType::kJoin) return os.str();
  os << " (";
  for (size_t i = 0; i < tensors.size(); ++i)
    os << (i ? "; " : "") << dtypeName(tensors[i].dtype) << " " << shapeStr(tensors[i].shape);
  if (type == OpType::kAllreduce || type == OpType::kReducescatter) os << ", " << reduceOpName(reduce().op);
  if (type == OpType::kBroadcast) os << ", root " << broadcast().root;
  if (type == OpType::kAlltoall) os << ", splits " << shapeStr(alltoall().splits);
  os << ")";
  return os.str();
}

int64_t reducescatterRows(int64_t dim0, int size, int rank) { return dim0 / size + (rank < dim0 % size ? 1 : 0); }

OpPlan makePlan(const std::vector<const Request*>& by_rank) {
  const int p = static_cast<int>(by_rank.size());
  const Request& first = *by_rank[0];
  switch (first.type) {
    case OpType::kAllgather: {
      AllgatherPlan plan;
      for (int r = 0; r < p; ++r)
        for (const auto& t : by_rank[r]->tensors) plan.first_dims.push_back(t.shape.empty() ? 1 : t.shape[0]);
      return plan;
    }
    case OpType::kAlltoall: {
      AlltoallPlan plan;
      for (int r = 0; r < p; ++r) {
        const std::vector<int64_t>& splits = by_rank[r]->alltoall().splits;
        const auto& shape = by_rank[r]->tensors.at(0).shape;
        const int64_t dim0 = shape.empty() ? 0 : shape[0];
        const bool fits = static_cast<int>(splits.size()) == p &&
                          std::all_of(splits.begin(), splits.end(), [](int64_t s) { return s >= 0; }) &&
                          std::accumulate(splits.begin(), splits.end(), int64_t(0)) == dim0;
        if (!fits)
          throw InvalidArgument(strCat("rank ", r, " submitted splits ", shapeStr(splits),
                                       " that do not divide its first dimension ", dim0, " among ", p, " ranks"));
        plan.splits.insert(plan.splits.end(), splits.begin(), splits.end());
      }
      return plan;
    }
    case OpType::kReducescatter: {
      ReducescatterPlan plan;
      for (const auto& t : first.tensors) {
        if (t.shape.empty()) throw InvalidArgument("reducescatter needs tensors with at least one dimension");
        for (int r = 0; r < p; ++r) plan.rows.push_back(reducescatterRows(t.shape[0], p, r));
      }
      return plan;
    }
    default: return std::monostate{};
  }
}

void Response::write(ByteWriter& w) const {
  w.put(type);
  w.putString(name);
  w.put(process_set_id);
  w.putString(error);
  // Error responses carry no plan.
  const size_t index = error.empty() ? planIndexFor(type) : 0;
  if (plan.index() != index)
    throw InvalidArgument(strCat(opTypeName(type), " '", name, "': response carries the wrong plan"));
  switch (index) {
    case 1: w.putVector(std::get<AllgatherPlan>(plan).first_dims); break;
    case 2: w.putVector(std::get<AlltoallPlan>(plan).splits); break;
    case 3: w.putVector(std::get<ReducescatterPlan>(plan).rows); break;
    case 4: w.put(std::get<JoinPlan>(plan).last_rank); break;
    default: break;
  }
  w.putVector(joined);
  w.put<uint8_t>(stand_in.has_value());
  if (stand_in) stand_in->write(w);
}

Response Response::read(ByteReader& r) {
  Response s;
  s.type = getOpType(r);
  s.name = r.getString();
  s.process_set_id = r.get<int32_t>();
  s.error = r.getString();
  switch (s.error.empty() ? planIndexFor(s.type) : 0) {
    case 1: s.plan = AllgatherPlan{r.getVector<int64_t>()}; break;
    case 2: s.plan = AlltoallPlan{r.getVector<int64_t>()}; break;
    case 3: s.plan = ReducescatterPlan{r.getVector<int64_t>()}; break;
    case 4: s.plan = JoinPlan{r.get<int32_t>()}; break;
    default: break;
  }
  s.joined = r.getVector<int32_t>();
  if (r.get<uint8_t>() != 0) {
    s.stand_in = Request::read(r);
    if (s.stand_in->type != s.type || s.stand_in->name != s.name)
      throw CollectiveError(strCat("corrupt control message (stand-in for ", opTypeName(s.type), " '", s.name, "')"));
  }
  return s;
}

std::vector<char> ResponseList::serialize() const {
  ByteWriter w;
  w.put<uint32_t>(static_cast<uint32_t>(responses.size()));
  for (const auto& s : responses) s.write(w);
  w.putVector(cached_ready);
  w.put<uint8_t>(shutdown);
  w.put(shutdown_rank);
  w.putString(shutdown_reason);
  w.putVector(busy_sets);
  return std::move(w.bytes());
}

ResponseList ResponseList::parse(const std::vector<char>& bytes) {
  ByteReader r(bytes.data(), bytes.size());
  ResponseList l;
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) l.responses.push_back(Response::read(r));
  l.cached_ready = r.getVector<uint32_t>();
  l.shutdown = r.get<uint8_t>() != 0;
  l.shutdown_rank = r.get<int32_t>();
  l.shutdown_reason = r.getString();
  l.busy_sets = r.getVector<int32_t>();
  r.expectEnd();
  return l;
}

std::vector<char> RankMessage::serialize() const {
  ByteWriter w;
  w.put<uint8_t>(shutdown);
  w.putString(failure);
  w.putVector(cache_bits);
  w.put<uint32_t>(static_cast<uint32_t>(uncached.size()));
  for (const auto& q : uncached) q.write(w);
  w.putVector(busy_sets);
  return std::move(w.bytes());
}

RankMessage RankMessage::parse(const std::vector<char>& bytes) {
  ByteReader r(bytes.data(), bytes.size());
  RankMessage m;
  m.shutdown = r.get<uint8_t>() != 0;
  m.failure = r.getString();
  m.cache_bits = r.getVector<uint64_t>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) m.uncached.push_back(Request::read(r));
  m.busy_sets = r.getVector<int32_t>();
  r.expectEnd();
  return m;
}

}  // namespace hvdtorch
