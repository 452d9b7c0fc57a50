#include "engine/request.h"

#include <algorithm>
#include <sstream>
#include <type_traits>

namespace hvdtorch {

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

// The op a control message names, checked against the op table.
const OpSpec& getOpSpec(ByteReader& r) {
  const auto v = r.get<uint8_t>();
  const OpSpec* spec = findOpSpec(v);
  if (!spec) throw CollectiveError(strCat("corrupt control message (op type ", unsigned(v), ")"));
  return *spec;
}

}  // namespace

void Request::write(ByteWriter& w) const {
  w.put(type);
  w.putString(name);
  w.put(process_set_id);
  w.put<uint32_t>(static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    w.put(t.dtype);
    w.put(t.device);
    w.putVector(t.shape);
  }
  if (args.index() != opSpec(type).args)
    throw InvalidArgument(strCat(opTypeName(type), " '", name, "': request carries the wrong payload"));
  std::visit([&](const auto& a) { a.write(w); }, args);
}

Request Request::read(ByteReader& r) {
  Request q;
  const OpSpec& spec = getOpSpec(r);
  q.type = spec.type;
  q.name = r.getString();
  q.process_set_id = r.get<int32_t>();
  const uint32_t n = r.get<uint32_t>();
  for (uint32_t i = 0; i < n; ++i) {
    TensorSpec t;
    t.dtype = getEnum<DataType>(r, static_cast<unsigned>(DataType::kBool) + 1, "dtype");
    t.device = getEnum<DeviceKind>(r, kDeviceKinds, "device kind");
    t.shape = r.getVector<int64_t>();
    q.tensors.push_back(std::move(t));
  }
  q.args = readAlternative<OpArgs>(spec.args, r);
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
    if (x.device != y.device)
      return strCat("device ", deviceKindName(x.device), " vs ", deviceKindName(y.device), which);
    if (opSpec(a.type).first_dim_free) {
      if (x.shape.empty() || y.shape.empty() || x.shape.size() != y.shape.size() ||
          !std::equal(x.shape.begin() + 1, x.shape.end(), y.shape.begin() + 1))
        return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape), " (", opTypeName(a.type),
                      " allows only the first dimension to differ)", which);
    } else if (x.shape != y.shape) {
      return strCat("shape ", shapeStr(x.shape), " vs ", shapeStr(y.shape), which);
    }
  }
  // Same type, so the same payload type (write() and read() see to that).
  return std::visit(
      [&](const auto& x) {
        using Args = std::decay_t<decltype(x)>;
        return x.mismatch(std::get<Args>(b.args));
      },
      a.args);
}

std::string Request::describe() const {
  std::ostringstream os;
  os << opTypeName(type) << " '" << name << "'";
  if (tensors.empty()) return os.str();  // barrier, join
  os << " (";
  for (size_t i = 0; i < tensors.size(); ++i) {
    os << (i ? "; " : "") << dtypeName(tensors[i].dtype) << " " << shapeStr(tensors[i].shape);
    if (tensors[i].device != DeviceKind::kCpu) os << " on " << deviceKindName(tensors[i].device);
  }
  std::visit([&](const auto& a) { a.describe(os); }, args);
  os << ")";
  return os.str();
}

OpPlan makePlan(const std::vector<const Request*>& by_rank) {
  const OpSpec& spec = opSpec(by_rank.at(0)->type);
  return spec.make_plan ? spec.make_plan(by_rank) : OpPlan{};
}

void Response::write(ByteWriter& w) const {
  w.put(type);
  w.putString(name);
  w.put(process_set_id);
  w.putString(error);
  // Error responses carry no plan.
  const size_t index = error.empty() ? opSpec(type).plan : planIndex<NoPlan>();
  if (plan.index() != index)
    throw InvalidArgument(strCat(opTypeName(type), " '", name, "': response carries the wrong plan"));
  std::visit([&](const auto& p) { p.write(w); }, plan);
  w.putVector(joined);
  w.put<uint8_t>(stand_in.has_value());
  if (stand_in) stand_in->write(w);
}

Response Response::read(ByteReader& r) {
  Response s;
  const OpSpec& spec = getOpSpec(r);
  s.type = spec.type;
  s.name = r.getString();
  s.process_set_id = r.get<int32_t>();
  s.error = r.getString();
  s.plan = readAlternative<OpPlan>(s.error.empty() ? spec.plan : planIndex<NoPlan>(), r);
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
