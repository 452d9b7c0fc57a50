#include "engine/request.h"

#include <sstream>

namespace hvdtorch {

const char* opTypeName(OpType t) {
  switch (t) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kBarrier: return "barrier";
  }
  return "unknown";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

std::string shapeStr(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

}  // namespace

void Request::write(ByteWriter& w) const {
  w.put(type);
  w.putString(name);
  w.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    w.put(t.dtype);
    w.putVector(t.shape);
  }
  w.put(op);
  w.put(root);
  w.put(prescale);
  w.put(postscale);
  w.put(reducer);
  w.put<uint8_t>(fuse);
}

Request Request::read(ByteReader& r) {
  Request q;
  q.type = r.get<OpType>();
  q.name = r.getString();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    TensorSpec t;
    t.dtype = r.get<DataType>();
    t.shape = r.getVector<int64_t>();
    q.tensors.push_back(std::move(t));
  }
  q.op = r.get<ReduceOp>();
  q.root = r.get<int32_t>();
  q.prescale = r.get<double>();
  q.postscale = r.get<double>();
  q.reducer = r.get<ReducerKind>();
  q.fuse = r.get<uint8_t>() != 0;
  return q;
}

std::string Request::signatureMismatch(const Request& a, const Request& b) {
  if (a.type != b.type) return strCat("operation ", opTypeName(a.type), " vs ", opTypeName(b.type));
  if (a.tensors.size() != b.tensors.size())
    return strCat("group of ", a.tensors.size(), " tensors vs ", b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& x = a.tensors[i];
    const auto& y = b.tensors[i];
    const std::string which = a.tensors.size() > 1 ? strCat(" (tensor ", i, " of the group)") : "";
    if (x.dtype != y.dtype) return strCat("dtype ", dtypeName(x.dtype), " vs ", dtypeName(y.dtype), which);
    if (a.type == OpType::kAllgather) {
      // Only the first dimension may differ.
      if (x.shape.empty() || y.shape.empty() || x.shape.size() != y.shape.size() ||
          !std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1))
        return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape),
                      " (allgather allows only the first dimension to differ)", which);
    } else if (x.shape != y.shape) {
      return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape), which);
    }
  }
  if (a.type == OpType::kAllreduce) {
    if (a.op != b.op) return strCat("reduce op ", reduceOpName(a.op), " vs ", reduceOpName(b.op));
    if (a.prescale != b.prescale || a.postscale != b.postscale)
      return strCat("scale factors (prescale ", a.prescale, ", postscale ", a.postscale, ") vs (prescale ",
                    b.prescale, ", postscale ", b.postscale, ")");
    if (a.reducer != b.reducer)
      return strCat("reducer ", reducerKindName(a.reducer), " vs ", reducerKindName(b.reducer));
    if (a.fuse != b.fuse) return strCat("fusion ", a.fuse ? "on" : "off", " vs ", b.fuse ? "on" : "off");
  }
  if (a.type == OpType::kBroadcast && a.root != b.root) return strCat("root rank ", a.root, " vs ", b.root);
  return "";
}

std::string Request::describe() const {
  std::ostringstream os;
  os << opTypeName(type) << " '" << name << "'";
  if (type == OpType::kBarrier) return os.str();
  os << " (";
  for (size_t i = 0; i < tensors.size(); ++i)
    os << (i ? "; " : "") << dtypeName(tensors[i].dtype) << " " << shapeStr(tensors[i].shape);
  if (type == OpType::kAllreduce) os << ", " << reduceOpName(op);
  if (type == OpType::kBroadcast) os << ", root " << root;
  os << ")";
  return os.str();
}

void Response::write(ByteWriter& w) const {
  w.put(type);
  w.put<uint32_t>(static_cast<uint32_t>(names.size()));
  for (const auto& n : names) w.putString(n);
  w.putString(error);
  w.putVector(first_dims);
}

Response Response::read(ByteReader& r) {
  Response s;
  s.type = r.get<OpType>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) s.names.push_back(r.getString());
  s.error = r.getString();
  s.first_dims = r.getVector<int64_t>();
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
  return l;
}

std::vector<char> RankMessage::serialize() const {
  ByteWriter w;
  w.put<uint8_t>(shutdown);
  w.putString(failure);
  w.putVector(cache_bits);
  w.put<uint32_t>(static_cast<uint32_t>(uncached.size()));
  for (const auto& q : uncached) q.write(w);
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
  return m;
}

}  // namespace hvdtorch
