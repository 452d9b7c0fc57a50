#include "bindings/py_engine.h"

#include <chrono>

#include "c10d_device_collectives.h"
#include "config/config.h"
#include "ops/op_table.h"
#include "output_pool.h"
#include "torch_tensor.h"

namespace py = pybind11;

namespace hvdtorch {

std::string opWhere(int rank, const char* op, const std::string& name) {
  return strCat("rank ", rank, ": ", op, " '", name, "'");
}

const at::Tensor& onlyTensor(const std::string& where, const char* what, const std::vector<at::Tensor>& ts) {
  if (ts.size() != 1) throw InvalidArgument(strCat(where, ": takes one ", what, " tensor, got ", ts.size()));
  return ts[0];
}

OutputAllocator cpuAllocator() {
  return [](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
    return std::make_shared<TorchTensor>(OutputPool::instance().empty(shape, toScalarType(dtype)), dtype);
  };
}

PyEngine::PyEngine(const std::map<std::string, std::string>& options, int rank, const std::vector<int>& host_of_rank,
                   c10::intrusive_ptr<c10d::ProcessGroup> control_pg, c10::intrusive_ptr<c10d::ProcessGroup> data_pg,
                   const std::string& shm_token, std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg)
    : native_(std::make_unique<C10dNative>(
          data_pg, device_pg ? std::make_unique<C10dDeviceCollectives>(*device_pg, data_pg) : nullptr)) {
  Engine::Transports t;
  // The control links end their waits themselves (c10d_link.h): a stalled
  // peer must not close the links that carry this rank's last word.
  auto watch = std::make_shared<DeadlineWatch>();
  t.control = [control_pg, watch](int peer) { return std::make_unique<C10dLink>(control_pg, peer, 0, watch); };
  t.data = [data_pg](int peer) { return std::make_unique<C10dLink>(data_pg, peer); };
  t.native = native_.get();
  t.shm_token = shm_token;
  const Config config = Config::load(options);
  engine_ = std::make_shared<Engine>(config, Topology::build(rank, host_of_rank), std::move(t), ops::opTable());
  OutputPool::instance().open(config.output_pool_bytes);
}

int32_t PyEngine::addProcessSet(const std::vector<int>& ranks,
                                std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> host_pg,
                                std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg) {
  std::unique_ptr<C10dNative> native;
  if (host_pg && device_pg)
    native = std::make_unique<C10dNative>(*host_pg, std::make_unique<C10dDeviceCollectives>(*device_pg, *host_pg));
  const int32_t id = engine_->addProcessSet(ranks, native.get());
  if (native) set_natives_[id] = std::move(native);
  return id;
}

void PyEngine::removeProcessSet(int32_t id) {
  {
    // Refused while the set has ops outstanding here; waits for the peers' device ring teardown.
    py::gil_scoped_release nogil;
    engine_->removeProcessSet(id);
  }
  set_natives_.erase(id);
}

std::map<int32_t, std::vector<int>> PyEngine::processSets() const {
  std::map<int32_t, std::vector<int>> out;
  for (const auto& ps : engine_->processSets()) out[ps->id] = ps->ranks;
  return out;
}

std::vector<at::Tensor> PyEngine::wait(int64_t handle) {
  auto st = engine_->state(handle);
  while (true) {
    bool done;
    {
      py::gil_scoped_release nogil;
      done = st->waitFor(std::chrono::milliseconds(100));
    }
    if (done) break;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  st->times.woken = OpTimes::now();
  engine_->release(handle);
  if (!st->error().empty()) throw CollectiveError(st->error());
  return collectOutputs(*st);
}

void PyEngine::startTimeline(const std::string& path, bool mark_cycles) {
  engine_->timeline().start(path, engine_->topo().rank, mark_cycles);
}

void PyEngine::shutdown() {
  py::gil_scoped_release nogil;
  engine_->shutdown();
  native_.reset();  // the engine no longer uses it; it holds the data process group
  set_natives_.clear();
  OutputPool::instance().close();  // outputs still held are freed when they go
}

py::dict PyEngine::topology() const {
  const Topology& t = engine_->topo();
  py::dict d;
  d["rank"] = t.rank;
  d["size"] = t.size;
  d["local_rank"] = t.local_rank;
  d["local_size"] = t.local_size;
  d["cross_rank"] = t.cross_rank;
  d["cross_size"] = t.cross_size;
  d["homogeneous"] = t.homogeneous();
  d["host_of_rank"] = t.host_of_rank;
  return d;
}

py::dict PyEngine::linkKinds() {
  py::dict d;
  auto& ctx = engine_->dataContext();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    auto kinds = ctx.linkKinds(peer);
    if (!kinds.empty()) d[py::int_(peer)] = kinds;
  }
  return d;
}

py::dict PyEngine::latencyPhases(bool clear) {
  const std::vector<OpPhases> log = engine_->latencyLog().snapshot();
  if (clear) engine_->latencyLog().clear();
  std::map<std::string, std::vector<int64_t>> cols;
  for (const OpPhases& p : log) {
    cols["binding"].push_back(p.binding);
    cols["control_wake"].push_back(p.control_wake);
    cols["negotiate"].push_back(p.negotiate);
    cols["executor_wake"].push_back(p.executor_wake);
    cols["copy_in"].push_back(p.copy_in);
    cols["reduce"].push_back(p.reduce);
    cols["finish"].push_back(p.finish);
    cols["waiter_wake"].push_back(p.waiter_wake);
  }
  py::dict d;
  for (auto& [k, v] : cols) d[py::str(k)] = v;
  return d;
}

py::dict PyEngine::negotiationStats() const {
  const Engine::NegotiationStats s = engine_->negotiationStats();
  py::dict d;
  d["decentralized"] = s.decentralized;
  d["star"] = s.star;
  return d;
}

py::dict PyEngine::costModel() {
  py::dict d;
  const ReducerSet& set = engine_->reducers();
  const CostModel model = set.model();
  for (const ReducerId id : set.automatic()) {
    const auto [alpha, beta] = model.line(id);
    d[reducerName(id)] = py::make_tuple(alpha, beta);
  }
  return d;
}

py::object PyEngine::linkCost() {
  const LinkCost link = engine_->reducers().model().link();
  if (!link.known()) return py::none();
  py::dict d;
  d["latency_s"] = link.latency;
  d["bytes_per_s"] = 1.0 / link.seconds_per_byte;
  return d;
}

py::list PyEngine::reducerChoices() {
  py::list out;
  const ReducerSet& set = engine_->reducers();
  const CostModel model = set.model();
  auto& ctx = engine_->dataContext();
  for (int band = 0; band < SizeBands::kCount; ++band) {
    py::dict row, est, samples;
    row["bytes"] = SizeBands::bytes(band);
    row["choice"] = reducerName(set.choose(ctx, SizeBands::bytes(band), DataType::kFloat32, ReduceOp::kSum));
    for (const ReducerId id : set.automatic()) {
      const double m = model.measured(band, id);
      est[reducerName(id)] = m < 0 ? py::object(py::none()) : py::object(py::float_(m));
      samples[reducerName(id)] = model.samples(band, id);
    }
    row["estimates_s"] = est;
    row["samples"] = samples;
    row["switches"] = model.switches(band);
    out.append(row);
  }
  return out;
}

std::string PyEngine::chooseReducer(size_t bytes, at::ScalarType dtype) {
  auto& ctx = engine_->dataContext();
  return reducerName(engine_->reducers().choose(ctx, bytes, toDataType(dtype, "choose_reducer"), ReduceOp::kSum));
}

}  // namespace hvdtorch
