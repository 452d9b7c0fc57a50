// The Python extension hvdtorch._C: the only translation unit that includes
// torch/extension.h. It adapts torch tensors and process groups to the core
// engine and translates errors (CollectiveError -> hvdtorch.HvdError, a
// RuntimeError; InvalidArgument -> ValueError).
#include <torch/extension.h>

#include <chrono>
#include <map>

#include "c10d_link.h"
#include "algorithms/reduce_kernels.h"
#include "common/error.h"
#include "config/config.h"
#include "grad_reducer.h"
#include "engine/engine.h"
#include "torch_tensor.h"

namespace py = pybind11;
using namespace hvdtorch;

namespace {

std::string where(const char* op, const std::string& name) { return strCat(op, " '", name, "'"); }

TensorPtr wrap(const at::Tensor& t, const char* op, const std::string& name, int rank) {
  const std::string w = strCat("rank ", rank, ": ", where(op, name));
  if (t.is_sparse()) throw InvalidArgument(strCat(w, ": sparse tensors are not supported; densify them first"));
  if (!t.device().is_cpu())
    throw InvalidArgument(strCat(w, ": tensor is on ", t.device().str(),
                                 ", but this hvdtorch build serves CPU tensors only"));
  if (!t.is_contiguous()) throw InvalidArgument(strCat(w, ": tensor must be contiguous"));
  return std::make_shared<TorchTensor>(t, toDataType(t.scalar_type(), w));
}

TensorSpec specOf(const TensorPtr& t) { return TensorSpec{t->dtype(), t->shape()}; }

class PyEngine {
 public:
  PyEngine(const std::map<std::string, std::string>& options, int rank, const std::vector<int>& host_of_rank,
           c10::intrusive_ptr<c10d::ProcessGroup> control_pg, c10::intrusive_ptr<c10d::ProcessGroup> data_pg,
           const std::string& shm_token)
      : native_(std::make_unique<C10dNative>(data_pg)) {
    Engine::Transports t;
    t.control = [control_pg](int peer) { return std::make_unique<C10dLink>(control_pg, peer); };
    t.data = [data_pg](int peer) { return std::make_unique<C10dLink>(data_pg, peer); };
    t.native = native_.get();
    t.shm_token = shm_token;
    engine_ = std::make_shared<Engine>(Config::load(options), Topology::build(rank, host_of_rank), std::move(t));
  }

  int64_t allreduce(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                    const std::string& name, int op, double prescale, double postscale, const std::string& reducer) {
    const int rank = engine_->topo().rank;
    if (inputs.empty() || inputs.size() != outputs.size())
      throw InvalidArgument(strCat("rank ", rank, ": ", where("allreduce", name), ": needs as many outputs as inputs"));
    auto e = std::make_shared<Entry>();
    Request& q = e->request;
    q.type = OpType::kAllreduce;
    q.name = name;
    q.op = static_cast<ReduceOp>(op);
    if (op < 0 || op > 5) throw InvalidArgument(strCat(where("allreduce", name), ": unknown reduce op ", op));
    for (const auto& t : inputs)
      checkReducible(toDataType(t.scalar_type(), strCat("rank ", rank, ": ", where("allreduce", name))), q.op);
    q.prescale = prescale;
    q.postscale = postscale;
    q.reducer = parseReducerKind(reducer.empty() ? engine_->config().reducer : reducer);
    for (size_t i = 0; i < inputs.size(); ++i) {
      e->inputs.push_back(wrap(inputs[i], "allreduce", name, rank));
      e->outputs.push_back(wrap(outputs[i], "allreduce", name, rank));
      q.tensors.push_back(specOf(e->inputs.back()));
      if (e->inputs.back()->numel() != e->outputs.back()->numel() ||
          e->inputs.back()->dtype() != e->outputs.back()->dtype())
        throw InvalidArgument(strCat("rank ", rank, ": ", where("allreduce", name), ": output does not match input"));
    }
    return submit(std::move(e));
  }

  int64_t allgather(const at::Tensor& input, const std::string& name) {
    auto e = std::make_shared<Entry>();
    e->request.type = OpType::kAllgather;
    e->request.name = name;
    e->inputs.push_back(wrap(input, "allgather", name, engine_->topo().rank));
    e->request.tensors.push_back(specOf(e->inputs.back()));
    const at::TensorOptions opts = input.options();
    const DataType dtype = e->inputs.back()->dtype();
    e->allocate = [opts, dtype](const std::vector<int64_t>& shape) -> TensorPtr {
      return std::make_shared<TorchTensor>(at::empty(shape, opts), dtype);
    };
    return submit(std::move(e));
  }

  int64_t broadcast(const at::Tensor& input, const at::Tensor& output, int root, const std::string& name) {
    const int rank = engine_->topo().rank;
    auto e = std::make_shared<Entry>();
    e->request.type = OpType::kBroadcast;
    e->request.name = name;
    e->request.root = root;
    e->inputs.push_back(wrap(input, "broadcast", name, rank));
    e->outputs.push_back(wrap(output, "broadcast", name, rank));
    e->request.tensors.push_back(specOf(e->inputs.back()));
    return submit(std::move(e));
  }

  int64_t barrier(const std::string& name) {
    auto e = std::make_shared<Entry>();
    e->request.type = OpType::kBarrier;
    e->request.name = name;
    return submit(std::move(e));
  }

  bool poll(int64_t handle) { return engine_->state(handle)->done(); }

  // Waits (without the GIL) for the op, then returns its outputs or raises.
  // Wakes every 100 ms to let Ctrl-C through.
  std::vector<at::Tensor> wait(int64_t handle) {
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
    engine_->release(handle);
    if (!st->error().empty()) throw CollectiveError(st->error());
    std::vector<at::Tensor> out;
    for (const auto& t : st->outputs()) out.push_back(static_cast<TorchTensor&>(*t).tensor());
    return out;
  }

  void shutdown() {
    py::gil_scoped_release nogil;
    engine_->shutdown();
  }

  py::dict topology() const {
    const Topology& t = engine_->topo();
    py::dict d;
    d["rank"] = t.rank;
    d["size"] = t.size;
    d["local_rank"] = t.local_rank;
    d["local_size"] = t.local_size;
    d["cross_rank"] = t.cross_rank;
    d["cross_size"] = t.cross_size;
    return d;
  }

  // peer -> transport kinds of the data links used so far.
  py::dict linkKinds() {
    py::dict d;
    auto& ctx = engine_->dataContext();
    for (int peer = 0; peer < ctx.size(); ++peer) {
      auto kinds = ctx.linkKinds(peer);
      if (!kinds.empty()) d[py::int_(peer)] = kinds;
    }
    return d;
  }

  // reducer -> (alpha seconds, beta seconds per byte) of the auto cost model.
  py::dict costModel() {
    py::dict d;
    const CostModel& m = engine_->reducers().model();
    for (ReducerKind k : {ReducerKind::kRing, ReducerKind::kNode, ReducerKind::kCentral, ReducerKind::kNative})
      if (m.available(k)) d[reducerKindName(k)] = py::make_tuple(m.alpha[static_cast<int>(k)], m.beta[static_cast<int>(k)]);
    return d;
  }

  std::string chooseReducer(size_t bytes, at::ScalarType dtype) {
    auto& ctx = engine_->dataContext();
    return reducerKindName(engine_->reducers().choose(ctx, bytes, toDataType(dtype, "choose_reducer"), ReduceOp::kSum));
  }

 private:
  int64_t submit(EntryPtr e) { return engine_->submit(std::move(e)); }

  std::unique_ptr<C10dNative> native_;
  std::shared_ptr<Engine> engine_;

 public:
  const std::shared_ptr<Engine>& engine() const { return engine_; }
};

std::unique_ptr<GradientReducer> makeGradientReducer(PyEngine& engine, std::vector<at::Tensor> params,
                                                     std::vector<std::vector<int64_t>> buckets,
                                                     const std::string& name, const std::string& reducer, int op,
                                                     double prescale, double postscale, bool pipeline,
                                                     bool sync_on_backward, bool fuse, int backward_passes_per_step,
                                                     bool fp16_wire) {
  GradReducerOptions o;
  o.name = name;
  o.reducer = parseReducerKind(reducer.empty() ? engine.engine()->config().reducer : reducer);
  o.op = static_cast<ReduceOp>(op);
  if (o.op != ReduceOp::kSum && o.op != ReduceOp::kAverage)
    throw InvalidArgument(strCat(name, ": gradients are reduced with Average or Sum"));
  o.prescale = prescale;
  o.postscale = postscale;
  o.pipeline = pipeline;
  o.sync_on_backward = sync_on_backward;
  o.fuse = fuse;
  o.backward_passes_per_step = backward_passes_per_step;
  if (fp16_wire) o.wire_dtype = at::kHalf;
  for (const auto& p : params) wrap(p, "DistributedModel", name, engine.engine()->topo().rank);
  return std::make_unique<GradientReducer>(engine.engine(), std::move(params), std::move(buckets), o);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hvdtorch C++ core (engine, reducers, transports)";
  static py::exception<CollectiveError> hvd_error(m, "HvdError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CollectiveError& e) {
      PyErr_SetString(hvd_error.ptr(), e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const std::map<std::string, std::string>&, int, const std::vector<int>&,
                    c10::intrusive_ptr<c10d::ProcessGroup>, c10::intrusive_ptr<c10d::ProcessGroup>,
                    const std::string&>(),
           py::arg("options"), py::arg("rank"), py::arg("host_of_rank"), py::arg("control_pg"), py::arg("data_pg"),
           py::arg("shm_token"))
      .def("allreduce", &PyEngine::allreduce)
      .def("allgather", &PyEngine::allgather)
      .def("broadcast", &PyEngine::broadcast)
      .def("barrier", &PyEngine::barrier)
      .def("poll", &PyEngine::poll)
      .def("wait", &PyEngine::wait)
      .def("shutdown", &PyEngine::shutdown)
      .def("topology", &PyEngine::topology)
      .def("choose_reducer", &PyEngine::chooseReducer)
      .def("link_kinds", &PyEngine::linkKinds)
      .def("cost_model", &PyEngine::costModel);

  py::class_<GradientReducer>(m, "GradientReducer")
      .def(py::init(&makeGradientReducer), py::arg("engine"), py::arg("params"), py::arg("buckets"),
           py::arg("name"), py::arg("reducer"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
           py::arg("pipeline"), py::arg("sync_on_backward"), py::arg("fuse"), py::arg("backward_passes_per_step"),
           py::arg("fp16_wire"))
      .def("rebuild", &GradientReducer::rebuild)
      .def("ready_order", &GradientReducer::readyOrder)
      .def("finalize", &GradientReducer::finalize, py::call_guard<py::gil_scoped_release>())
      .def("set_sync_enabled", &GradientReducer::setSyncEnabled)
      .def("bucket_bytes", &GradientReducer::bucketBytes);

  m.def("knobs", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const auto& k : Config::knobs()) out.emplace_back("HVDTORCH_" + k.name, k.default_value, k.help);
    return out;
  });
  // Validates the options (ValueError names a bad one) and returns what the
  // Python side needs before the engine exists: the effective HVDTORCH_TIMEOUT
  // in seconds (torch.distributed gets the same deadline) and
  // HVDTORCH_HOSTNAME. Config is the one place knobs are parsed.
  m.def("resolve_options", [](const std::map<std::string, std::string>& options) {
    const Config c = Config::load(options);
    py::dict d;
    d["timeout"] = std::chrono::duration<double>(c.timeout).count();
    d["hostname"] = c.hostname;
    return d;
  });
}
