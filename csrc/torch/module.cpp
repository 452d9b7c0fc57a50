// The Python extension hvdtorch._C: the only translation unit that includes
// torch/extension.h. It converts types only -- torch tensors and process
// groups to the core's buffers and links, Python ints to core enums -- and
// calls the core's per-op entry functions (csrc/core/ops), which hold every
// check and policy. Each op's options struct is bound as it is
// (_C.<Op>Options, bindOp below): Python fills it and hands it to
// Engine.submit with the op's tensors. Errors are translated (CollectiveError ->
// hvdtorch.HvdError, a RuntimeError; InvalidArgument ->
// hvdtorch.InvalidArgumentError, both a ValueError and a RuntimeError).
#include <torch/extension.h>

#include <chrono>
#include <map>
#include <optional>
#include <tuple>
#include <type_traits>

#include "algorithms/device_ring.h"
#include "build_info.h"
#include "c10d_link.h"
#include "common/error.h"
#include "config/config.h"
#include "device/devices.h"
#include "device/sim_device.h"
#include "engine/engine.h"
#include "engine/negotiation/coordinator.h"
#include "grad_reducer.h"
#include "gradients/pass_counter.h"
#include "gradients/shard_range.h"
#include "ops/all_ops.h"  // generated (CMakeLists.txt): every header of csrc/core/ops/
#include "python_errors.h"
#include "registered_tensor.h"
#include "strategies/powersgd.h"
#include "tensor_binding.h"
#include "torch_tensor.h"
#include "transport/shm/registered_memory.h"
#include "transport/shm/segment.h"

namespace py = pybind11;
using namespace hvdtorch;

namespace {

// The prefix of an op's errors: "rank 2: allreduce 'grad.w'".
std::string opWhere(int rank, const char* op, const std::string& name) {
  return strCat("rank ", rank, ": ", op, " '", name, "'");
}

// Which tensor fields an op's options struct has (C++17 detection): its
// tensors as a list (inputs, outputs) or one (input, output), an output
// allocator.
template <typename Options, template <typename> class Field, typename = void>
struct Has : std::false_type {};
template <typename Options, template <typename> class Field>
struct Has<Options, Field, std::void_t<Field<Options>>> : std::true_type {};
template <typename O>
using InputsField = decltype(std::declval<O&>().inputs);
template <typename O>
using InputField = decltype(std::declval<O&>().input);
template <typename O>
using OutputsField = decltype(std::declval<O&>().outputs);
template <typename O>
using OutputField = decltype(std::declval<O&>().output);
template <typename O>
using AllocateField = decltype(std::declval<O&>().allocate);

// The one tensor of a field that holds one (`what`: "input", "output").
const at::Tensor& onlyTensor(const std::string& where, const char* what, const std::vector<at::Tensor>& ts) {
  if (ts.size() != 1) throw InvalidArgument(strCat(where, ": takes one ", what, " tensor, got ", ts.size()));
  return ts[0];
}

// A Python callable as a std::function that may be called, copied and
// destroyed on any thread (the autograd engine's): each takes the GIL.
std::function<void()> pythonCallback(py::function fn) {
  std::shared_ptr<py::function> held(new py::function(std::move(fn)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [held] {
    py::gil_scoped_acquire gil;
    (*held)();
  };
}

// Outputs of an op without input tensors (join's int32 scalar): CPU tensors,
// never device buffers.
OutputAllocator cpuAllocator() {
  return [](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
    return std::make_shared<TorchTensor>(at::empty(shape, at::TensorOptions().dtype(toScalarType(dtype))), dtype);
  };
}

class PyEngine {
 public:
  PyEngine(const std::map<std::string, std::string>& options, int rank, const std::vector<int>& host_of_rank,
           c10::intrusive_ptr<c10d::ProcessGroup> control_pg, c10::intrusive_ptr<c10d::ProcessGroup> data_pg,
           const std::string& shm_token, std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg)
      : native_(std::make_unique<C10dNative>(
            data_pg, device_pg ? std::make_unique<C10dDeviceCollectives>(*device_pg, data_pg) : nullptr)) {
    Engine::Transports t;
    t.control = [control_pg](int peer) { return std::make_unique<C10dLink>(control_pg, peer); };
    t.data = [data_pg](int peer) { return std::make_unique<C10dLink>(data_pg, peer); };
    t.native = native_.get();
    t.shm_token = shm_token;
    engine_ = std::make_shared<Engine>(Config::load(options), Topology::build(rank, host_of_rank), std::move(t),
                                       ops::opTable());
  }

  // Submits one op (an options struct of csrc/core/ops, `Entry` its entry
  // function) as Python filled it, with the op's tensors bound here:
  // `inputs` into its inputs (or its one input), `outputs` likewise, and,
  // for an op that allocates its outputs, an allocator like the first input
  // (CPU tensors for an op without inputs).
  template <typename Options, int64_t (*Entry)(Engine&, Options)>
  int64_t submit(Options opts, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
    const auto bound = OpTimes::now();
    const std::string where = opWhere(rank(), opTypeName(Options::kType), opts.name);
    OpBinding b(where);
    if constexpr (Has<Options, InputsField>::value) opts.inputs = b.bindAll(inputs);
    if constexpr (Has<Options, InputField>::value) opts.input = b.bind(onlyTensor(where, "input", inputs));
    if constexpr (Has<Options, OutputsField>::value) opts.outputs = b.bindAll(outputs);
    if constexpr (Has<Options, OutputField>::value) opts.output = b.bind(onlyTensor(where, "output", outputs));
    if constexpr (Has<Options, AllocateField>::value)
      opts.allocate = inputs.empty() ? cpuAllocator() : b.allocatorLike(inputs[0]);
    const int64_t handle = Entry(*engine_, std::move(opts));
    engine_->state(handle)->times.bound = bound;
    return handle;
  }

  // Process sets: hvdtorch/process_set_table.py makes add/remove
  // collectives. `host_pg` and `device_pg`: groups over exactly the set's
  // ranks (members only), through which the set's device tensors go as the
  // global set's go through the engine's (c10d_device_collectives.h).
  int32_t addProcessSet(const std::vector<int>& ranks, std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> host_pg,
                        std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg) {
    std::unique_ptr<C10dNative> native;
    if (host_pg && device_pg)
      native = std::make_unique<C10dNative>(*host_pg, std::make_unique<C10dDeviceCollectives>(*device_pg, *host_pg));
    const int32_t id = engine_->addProcessSet(ranks, native.get());
    if (native) set_natives_[id] = std::move(native);
    return id;
  }
  void removeProcessSet(int32_t id) {
    {
      // Refused while the set has ops outstanding here; waits for the peers' device ring teardown.
      py::gil_scoped_release nogil;
      engine_->removeProcessSet(id);
    }
    set_natives_.erase(id);
  }
  // id -> global ranks, for every set this rank knows (members or not).
  std::map<int32_t, std::vector<int>> processSets() const {
    std::map<int32_t, std::vector<int>> out;
    for (const auto& ps : engine_->processSets()) out[ps->id] = ps->ranks;
    return out;
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
    st->times.woken = OpTimes::now();
    engine_->release(handle);
    if (!st->error().empty()) throw CollectiveError(st->error());
    return collectOutputs(*st);
  }

  void startTimeline(const std::string& path, bool mark_cycles) {
    engine_->timeline().start(path, engine_->topo().rank, mark_cycles);
  }

  void shutdown() {
    py::gil_scoped_release nogil;
    engine_->shutdown();
    native_.reset();  // the engine no longer uses it; it holds the data process group
    set_natives_.clear();
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
    d["homogeneous"] = t.homogeneous();
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

  // The phases (op_timing.h) of the last ops waited for, in nanoseconds:
  // {phase: [one value per op, oldest first]}, -1 where not stamped.
  // clear=True forgets them afterwards.
  py::dict latencyPhases(bool clear) {
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

  // Negotiation rounds so far (every process set): how many were settled by
  // the decentralized AND alone, how many went through a coordinator.
  py::dict negotiationStats() const {
    const Engine::NegotiationStats s = engine_->negotiationStats();
    py::dict d;
    d["decentralized"] = s.decentralized;
    d["star"] = s.star;
    return d;
  }

  // reducer -> (alpha seconds, beta seconds per byte): the line through the
  // auto cost model's estimates at 4 KiB and 256 MiB (a summary; the model
  // itself is per size band, see reducerChoices).
  py::dict costModel() {
    py::dict d;
    const ReducerSet& set = engine_->reducers();
    const CostModel model = set.model();
    for (const ReducerId id : set.automatic()) {
      const auto [alpha, beta] = model.line(id);
      d[reducerName(id)] = py::make_tuple(alpha, beta);
    }
    return d;
  }

  // The link between hosts as calibration measured it: {latency_s,
  // bytes_per_s}; None on one host or without calibration.
  py::object linkCost() {
    const LinkCost link = engine_->reducers().model().link();
    if (!link.known()) return py::none();
    py::dict d;
    d["latency_s"] = link.latency;
    d["bytes_per_s"] = 1.0 / link.seconds_per_byte;
    return d;
  }

  // Per size band of the auto cost model: its size, the reducer auto runs
  // for float32 Sum, and per reducer the agreed estimate (seconds; None
  // until measured) and the samples seen.
  py::list reducerChoices() {
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

  std::string chooseReducer(size_t bytes, at::ScalarType dtype) {
    auto& ctx = engine_->dataContext();
    return reducerName(engine_->reducers().choose(ctx, bytes, toDataType(dtype, "choose_reducer"), ReduceOp::kSum));
  }

  const std::shared_ptr<Engine>& engine() const { return engine_; }

 private:
  int rank() const { return engine_->topo().rank; }

  std::unique_ptr<C10dNative> native_;
  std::map<int32_t, std::unique_ptr<C10dNative>> set_natives_;  // process set id -> its groups' collectives
  std::shared_ptr<Engine> engine_;
};

std::unique_ptr<GradientReducer> makeGradientReducer(PyEngine& engine, std::vector<at::Tensor> params,
                                                     std::vector<std::vector<int64_t>> buckets,
                                                     const GradReducerOptions& options,
                                                     std::shared_ptr<PassCounter> counter) {
  for (const auto& p : params)
    OpBinding::check(p, opWhere(engine.engine()->topo().rank, "DistributedModel", options.name));
  return std::make_unique<GradientReducer>(engine.engine(), std::move(params), std::move(buckets), options,
                                           std::move(counter));
}

// Binds one plain field of an options struct by its name; a reduce op as
// Horovod's int, checked by toReduceOp when set.
template <typename Options, typename T>
void bindField(py::class_<Options>& c, const ops::OptionField<Options, T>& f) {
  if constexpr (std::is_same_v<T, ReduceOp>) {
    const auto member = f.member;
    c.def_property(
        f.name, [member](const Options& o) { return static_cast<int>(o.*member); },
        [member](Options& o, int op) { o.*member = ops::toReduceOp(op); });
  } else {
    c.def_readwrite(f.name, f.member);
  }
}

// GradientReducer's options as _C.GradientReducerOptions: every field by its
// name (hvdtorch/training/reducer_options.py fills them); the op as
// Horovod's int (bindField), the codec and the mode by name.
void bindGradientReducerOptions(py::module_& m) {
  using O = GradReducerOptions;
  py::class_<O> c(m, "GradientReducerOptions");
  c.def(py::init<>());
  bindField(c, ops::field("name", &O::name));
  bindField(c, ops::field("reducer", &O::reducer));
  bindField(c, ops::field("op", &O::op));
  bindField(c, ops::field("prescale", &O::prescale));
  bindField(c, ops::field("postscale", &O::postscale));
  bindField(c, ops::field("pipeline", &O::pipeline));
  bindField(c, ops::field("sync_on_backward", &O::sync_on_backward));
  bindField(c, ops::field("fuse", &O::fuse));
  bindField(c, ops::field("backward_passes_per_step", &O::backward_passes_per_step));
  bindField(c, ops::field("process_set_id", &O::process_set_id));
  bindField(c, ops::field("strategy", &O::strategy));
  bindField(c, ops::field("strategy_instance", &O::strategy_instance));
  bindField(c, ops::field("sparse_refusal", &O::sparse_refusal));
  bindField(c, ops::field("param_names", &O::param_names));
  c.def_property(
      "codec", [](const O& o) { return std::string(wireCodecName(o.codec)); },
      [](O& o, const std::string& name) { o.codec = wireCodecFromName(name); });
  c.def_property(
      "mode", [](const O& o) { return std::string(o.mode == ReducerMode::kDeltas ? "deltas" : "gradients"); },
      [](O& o, const std::string& mode) {
        if (mode == "deltas") {
          o.mode = ReducerMode::kDeltas;
        } else if (mode == "gradients") {
          o.mode = ReducerMode::kGradients;
        } else {
          throw InvalidArgument(strCat("hvdtorch: GradientReducer mode '", mode, "': 'gradients' or 'deltas'"));
        }
      });
}

// Binds one op: its options struct as _C.<name>, default-constructed, with
// every plain field its fields() lists (ops/option_fields.h), and the
// overload Engine.submit(options, inputs, outputs) that submits it
// (PyEngine::submit). Tensors are never fields on the Python side.
template <typename Options, int64_t (*Entry)(Engine&, Options)>
void bindOp(py::module& m, py::class_<PyEngine>& engine, const char* name) {
  engine.def("submit", &PyEngine::submit<Options, Entry>, py::arg("options"),
             py::arg("inputs") = std::vector<at::Tensor>{}, py::arg("outputs") = std::vector<at::Tensor>{});
  py::class_<Options> c(m, name);
  c.def(py::init<>());
  std::apply([&c](const auto&... f) { (bindField(c, f), ...); }, Options::fields());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hvdtorch C++ core (engine, reducers, transports)";
  bindBuildInfo(m);
  installDeviceMakers();
  static py::exception<CollectiveError> hvd_error(m, "HvdError", PyExc_RuntimeError);
  setHvdErrorType(hvd_error.ptr());
  // Both bases: our contract says bad arguments raise ValueError; Horovod
  // raises its argument errors from the core as RuntimeError, which scripts
  // written for it catch.
  static py::exception<InvalidArgument> invalid_argument(
      m, "InvalidArgumentError", py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError)));
  setInvalidArgumentType(invalid_argument.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CollectiveError& e) {
      PyErr_SetString(hvd_error.ptr(), e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(invalid_argument.ptr(), e.what());
    } catch (const PassLimitError& e) {
      PyErr_SetString(PyExc_AssertionError, e.what());  // Horovod's contract for an extra backward pass
    }
  });

  py::class_<PyEngine> engine(m, "Engine");
  engine
      .def(py::init<const std::map<std::string, std::string>&, int, const std::vector<int>&,
                    c10::intrusive_ptr<c10d::ProcessGroup>, c10::intrusive_ptr<c10d::ProcessGroup>, const std::string&,
                    std::optional<c10::intrusive_ptr<c10d::ProcessGroup>>>(),
           py::arg("options"), py::arg("rank"), py::arg("host_of_rank"), py::arg("control_pg"), py::arg("data_pg"),
           py::arg("shm_token"), py::arg("device_pg") = py::none(),
           // Building the engine waits for every peer: other Python threads
           // (a user's watchdog, a timer) must be able to run meanwhile.
           py::call_guard<py::gil_scoped_release>())
      .def("add_process_set", &PyEngine::addProcessSet, py::arg("ranks"), py::arg("host_pg") = py::none(),
           py::arg("device_pg") = py::none())
      .def("remove_process_set", &PyEngine::removeProcessSet)
      .def("process_sets", &PyEngine::processSets)
      .def("poll", &PyEngine::poll)
      .def("wait", &PyEngine::wait)
      .def("shutdown", &PyEngine::shutdown)
      .def("start_timeline", &PyEngine::startTimeline)
      .def("stop_timeline", [](PyEngine& e) { e.engine()->timeline().stop(); })
      .def("topology", &PyEngine::topology)
      .def("choose_reducer", &PyEngine::chooseReducer)
      .def("link_kinds", &PyEngine::linkKinds)
      .def("cost_model", &PyEngine::costModel)
      .def("reducer_choices", &PyEngine::reducerChoices)
      .def("link_cost", &PyEngine::linkCost)
      .def("negotiation_stats", &PyEngine::negotiationStats)
      // Run-time settings for autotune (engine.h: when a change is safe).
      .def("fusion_threshold", [](PyEngine& e) { return e.engine()->fusionThreshold(); })
      .def("set_fusion_threshold", [](PyEngine& e, size_t bytes) { e.engine()->setFusionThreshold(bytes); })
      .def("cycle_time_ms", [](PyEngine& e) { return e.engine()->cycleTime().count() / 1000.0; })
      .def("set_cycle_time_ms",
           [](PyEngine& e, double ms) {
             if (!(ms >= 0)) throw InvalidArgument(strCat("cycle time must be a non-negative number of ms, got ", ms));
             e.engine()->setCycleTime(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
           })
      // A zero-filled 1-D CPU tensor in registered memory (what
      // DistributedModel's buckets use); plain memory where there is none.
      .def("registered_zeros",
           [](PyEngine& e, int64_t numel, py::object dtype) {
             return registeredZeros(*e.engine(), numel, torch::python::detail::py_object_to_dtype(dtype));
           })
      // (own live buffers, mapped peer buffers); (0, 0) without registered memory.
      .def("registered_stats",
           [](PyEngine& e) {
             const auto& r = e.engine()->registered();
             return r ? std::make_pair(r->ownBuffers(), r->peerMappings()) : std::make_pair(size_t(0), size_t(0));
           })
      .def("fusion_buffer_bytes", [](PyEngine& e) { return e.engine()->fusionBufferBytes(); })
      .def("latency_phases", &PyEngine::latencyPhases, py::arg("clear") = false);

  // The ops: each options struct (csrc/core/ops/<op>.h) and its
  // Engine.submit overload, for every op HVDTORCH_OPS lists
  // (engine/op_spec.h). The hottest op, the all-reduce, first: pybind tries
  // the overloads in this order.
#define HVDTORCH_BIND_OP(Op, op) bindOp<ops::Op##Options, ops::op>(m, engine, #Op "Options");
  HVDTORCH_OPS(HVDTORCH_BIND_OP)
#undef HVDTORCH_BIND_OP

  // A strategy made in Python and handed to one GradientReducer (strategy_object=), so that its state
  // stays reachable: PowerSGD's (strategies/powersgd.h, hvdtorch/collectives/powersgd.py).
  py::class_<BucketStrategy, std::shared_ptr<BucketStrategy>>(m, "BucketStrategy")
      .def_property_readonly("name", [](const BucketStrategy& s) { return std::string(s.name()); });
  py::class_<PowerSGDStrategy, BucketStrategy, std::shared_ptr<PowerSGDStrategy>>(m, "PowerSGDStrategy")
      .def(py::init([](int64_t rank, int64_t start_iter, double min_compression_rate, bool fp16, uint64_t seed) {
             return std::make_shared<PowerSGDStrategy>(
                 PowerSGDOptions{rank, start_iter, min_compression_rate, fp16, seed});
           }),
           py::arg("rank"), py::arg("start_iter"), py::arg("min_compression_rate"), py::arg("fp16"), py::arg("seed"))
      .def_property_readonly("iteration", &PowerSGDStrategy::iteration)
      // (iteration, {parameter index: error}, {parameter index: Q}), copies.
      .def("state",
           [](const PowerSGDStrategy& s) {
             std::map<int64_t, at::Tensor> errors, qs;
             int64_t iteration = 0;
             {
               py::gil_scoped_release release;
               iteration = s.iteration();
               for (auto& [param, st] : s.state()) {
                 errors[param] = st.error;
                 qs[param] = st.q;
               }
             }
             return py::make_tuple(iteration, errors, qs);
           })
      .def(
          "load_state",
          [](PowerSGDStrategy& s, int64_t iteration, const std::map<int64_t, at::Tensor>& errors,
             const std::map<int64_t, at::Tensor>& qs) {
            std::map<int64_t, PowerSGDParamState> state;
            for (const auto& [param, error] : errors) {
              const auto q = qs.find(param);
              state[param] = {error, q == qs.end() ? at::Tensor() : q->second};
            }
            for (const auto& [param, q] : qs)
              if (!errors.count(param)) state[param] = {at::Tensor(), q};
            py::gil_scoped_release release;
            s.loadState(iteration, state);
          },
          py::arg("iteration"), py::arg("errors"), py::arg("qs"));

  bindGradientReducerOptions(m);
  py::class_<GradientReducer>(m, "GradientReducer")
      .def(py::init(&makeGradientReducer), py::arg("engine"), py::arg("params"), py::arg("buckets"), py::arg("options"),
           py::arg("counter") = nullptr)
      .def("rebuild", &GradientReducer::rebuild)
      .def("ready_order", &GradientReducer::readyOrder)
      .def("finalize", &GradientReducer::finalize, py::call_guard<py::gil_scoped_release>())
      .def("reducing", &GradientReducer::reducing)
      .def("finish_bucket", &GradientReducer::finishBucket, py::arg("index"), py::call_guard<py::gil_scoped_release>())
      .def("bucket_params", &GradientReducer::bucketParams)
      .def("synchronize", &GradientReducer::synchronize, py::call_guard<py::gil_scoped_release>())
      .def("reduce_now", &GradientReducer::reduceNow, py::arg("tensors"), py::call_guard<py::gil_scoped_release>())
      .def("passes_pending", &GradientReducer::passesPending)
      .def("reset_passes", &GradientReducer::resetPasses, py::arg("backward_passes_per_step") = py::none())
      .def("set_backward_passes_per_step", &GradientReducer::setPassesPerStep)
      .def("view_gradients", &GradientReducer::viewGradients)
      .def("set_sync_enabled", &GradientReducer::setSyncEnabled)
      .def(
          "set_pass_callbacks",
          [](GradientReducer& r, py::function at_start, py::function after_drop) {
            r.setPassCallbacks(pythonCallback(std::move(at_start)), pythonCallback(std::move(after_drop)));
          },
          py::arg("at_start"), py::arg("after_drop"))
      .def_property_readonly("counter", &GradientReducer::counter)
      .def("flats", &GradientReducer::flats)
      .def("bucket_offsets", &GradientReducer::bucketOffsets)
      .def("bucket_bytes", &GradientReducer::bucketBytes);

  // The shard rule (gradients/shard_range.h): [start, end) of a bucket's elements set rank `rank` of `size` owns.
  m.def(
      "shard_range",
      [](int64_t numel, int rank, int size) {
        const ShardRange r = shardRange(numel, rank, size);
        return std::make_pair(r.start, r.end);
      },
      py::arg("numel"), py::arg("rank"), py::arg("size"));

  // The codec seam (gradients/wire_codec.h): the dtype a tensor travels in;
  // hvdtorch.Compression asks here, as the C++ GradientReducer's buckets do.
  m.def(
      "wire_dtype",
      [](const std::string& codec, at::ScalarType dtype) { return wireScalarType(wireCodecFromName(codec), dtype); },
      py::arg("codec"), py::arg("dtype"));

  // The one backward-pass counter (gradients/pass_counter.h) of the Python
  // gradient paths; its beginPass() raises AssertionError on an extra pass.
  py::class_<PassCounter, std::shared_ptr<PassCounter>>(m, "PassCounter")
      .def(py::init(
               [](int passes_per_step, bool strict, int rank, const std::string& step_call, const std::string& advice) {
                 PassCounterOptions o;
                 o.passes_per_step = passes_per_step;
                 o.strict = strict;
                 o.rank = rank;
                 if (!step_call.empty()) o.step_call = step_call;
                 if (!advice.empty()) o.advice = advice;
                 return std::make_shared<PassCounter>(o);
               }),
           py::arg("backward_passes_per_step"), py::arg("strict") = true, py::arg("rank") = 0,
           py::arg("step_call") = "", py::arg("advice") = "")
      .def("begin_pass", &PassCounter::beginPass, py::arg("subject") = "")
      .def("set_rank", &PassCounter::setRank)
      .def("end_pass", &PassCounter::endPass)
      .def_property_readonly("in_pass", &PassCounter::inPass)
      .def_property_readonly("reducing", &PassCounter::reducing)
      .def_property("local", &PassCounter::local, &PassCounter::setLocal)
      .def_property_readonly("passes", &PassCounter::passes)
      .def("pending", &PassCounter::pending)
      .def("due", &PassCounter::due)
      .def_property("backward_passes_per_step", &PassCounter::passesPerStep, &PassCounter::setPassesPerStep)
      .def("reset", &PassCounter::reset, py::arg("backward_passes_per_step") = py::none());

  // The reducer registry (algorithms/reducer_registry.h), row by row: name,
  // the reduce op it defines itself (None for most), whether `auto` may pick
  // it, whether it is the one that reduces registered buffers in place
  // (registeredReducer()).
  m.def("reducer_registry", [] {
    py::list rows;
    const auto& table = reducerRegistry();
    for (size_t id = 0; id < table.size(); ++id) {
      const ReducerEntry& r = table[id];
      py::dict row;
      row["name"] = r.name;
      row["own_op"] = r.own_op ? py::object(py::str(reduceOpName(*r.own_op))) : py::object(py::none());
      row["automatic"] = r.automatic;
      row["registered"] = static_cast<ReducerId>(id) == registeredReducer();
      rows.append(row);
    }
    return rows;
  });
  // Ops named with this prefix are never stood in for by joined ranks
  // (engine/negotiation/coordinator.h): a joined rank submits them itself.
  m.attr("NO_STAND_IN_PREFIX") = std::string(kNoStandInPrefix);
  m.def("knobs", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const auto& k : Config::knobs()) out.emplace_back("HVDTORCH_" + k.name, k.default_value, k.help);
    return out;
  });
  // Validates the options (ValueError names a bad one) and returns what the
  // Python side reads: the effective HVDTORCH_TIMEOUT in seconds
  // (torch.distributed gets the same deadline), HVDTORCH_HOSTNAME and the
  // autotune knobs. Config is the one place knobs are parsed.
  m.def("resolve_options", [](const std::map<std::string, std::string>& options) {
    const Config c = Config::load(options);
    py::dict d;
    d["timeout"] = std::chrono::duration<double>(c.timeout).count();
    d["hostname"] = c.hostname;
    d["autotune"] = c.autotune;
    d["autotune_log"] = c.autotune_log;
    d["autotune_warmup_steps"] = c.autotune_warmup_steps;
    d["autotune_steps_per_trial"] = c.autotune_steps_per_trial;
    d["autotune_rounds"] = c.autotune_rounds;
    return d;
  });
  // HVDTORCH_SIM_DEVICE=1 (tensor_binding.h): CPU tensors reach the engine as simulated-device memory. The count
  // is of copies the engine made on sim:0's engine stream through host memory it had not registered (none should).
  m.def("sim_device_mode", &simDeviceMode);
  m.def("sim_unpinned_engine_copies", [] { return simUnpinnedEngineCopies(deviceFor(DeviceId{DeviceKind::kSim, 0})); });
  // Interprocess simulated memory this process freed while a peer still had it open (none should be).
  m.def("sim_released_while_open", &simReleasedWhileOpen);
  // hvd.init() gives simulated devices the rank to seed their streams with; tests read the seeds.
  m.def("set_sim_rank", &setSimRank);
  m.def("sim_stream_seed", [](uint64_t stream) { return simStreamSeed(SimOptions::fromEnv(), stream); });
  // All-reduces this process ran on the device ring (algorithms/device_ring.h), for tests.
  m.def("device_ring_runs", &DeviceRing::runs);
  // All-reduces this process ran through the device group (c10d_device_collectives.h), for tests.
  m.def("device_native_runs", &C10dDeviceCollectives::runs);
  // All-reduces of device tensors this process ran alone (a set of one rank), on the device (ops/allreduce.h).
  m.def("device_one_rank_runs", &ops::oneRankDeviceAllreduces);
  // Device calibrations this process ran for reducer=auto, and the last one's times (algorithms/device_router.h).
  m.def("device_calibrations", &deviceCalibrations);
  m.def("last_device_calibration", &lastDeviceCalibration);
  // Removes what killed jobs left in /dev/shm (segments of hvdtorch jobs whose creator is dead); init() calls it.
  m.def("remove_dead_shm_segments", [] { return ShmSegment::removeDeadJobSegments(); });
  // Phases recorded from Python on the engine's timeline clock (DistributedModel's FORWARD and BACKWARD, so
  // that a trace shows how communication overlaps compute). No-ops while no timeline is written.
  m.def("timeline_enabled", [](PyEngine& e) { return e.engine()->timeline().enabled(); });
  m.def("timeline_begin",
        [](PyEngine& e, const std::string& op, const std::string& phase) { e.engine()->timeline().begin(op, phase); });
  m.def("timeline_end",
        [](PyEngine& e, const std::string& op, const std::string& phase) { e.engine()->timeline().end(op, phase); });
}
