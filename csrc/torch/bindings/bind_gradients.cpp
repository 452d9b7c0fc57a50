// The gradient core as Python drives it: _C.GradientReducer
// (grad_reducer.h) and its options, the strategy objects made in Python
// (PowerSGD's), the backward-pass counter, the shard rule, the wire
// codec's dtype rule, and the data swap that keeps a parameter's gradient
// accumulator (shard=3 under a mixed-precision policy).
#include <torch/extension.h>

#include "bindings/bind_field.h"
#include "bindings/bindings.h"
#include "bindings/py_engine.h"
#include "delta_reducer.h"
#include "grad_reducer.h"
#include "gradients/bucket_packing.h"
#include "gradients/pass_counter.h"
#include "gradients/shard_range.h"
#include "strategies/powersgd.h"
#include "torch_tensor.h"

namespace py = pybind11;

namespace hvdtorch {

namespace {

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

// Every parameter a reducer is built over is a tensor the engine can take (OpBinding::check), named by `front`.
void checkParameters(const PyEngine& engine, const std::vector<at::Tensor>& params, const char* front,
                     const std::string& name) {
  for (const auto& p : params) OpBinding::check(p, opWhere(engine.engine()->topo().rank, front, name));
}

// torch's set_data() forgets a leaf's gradient accumulator when the new data has another dtype, so that
// the next graph makes a new one: the reducers' hooks (accumulator_hooks.h) hang on the old one. This puts
// the old one back. Its input metadata keeps the parameter's first dtype, so autograd converts a gradient
// computed in another dtype into it before accumulating (validate_outputs): .grad stays in the master's
// dtype. The accumulator's handle type differs between torch versions (shared_ptr in 2.11, intrusive_ptr
// in 2.13): WeakOf names the weak handle of this torch's.
template <typename Strong>
struct WeakOf;
template <typename T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <typename T, typename N>
struct WeakOf<c10::intrusive_ptr<T, N>> {
  using type = c10::weak_intrusive_ptr<T, N>;
};

void setDataKeepingAccumulator(const at::Tensor& param, const at::Tensor& data) {
  const auto acc = torch::autograd::impl::try_get_grad_accumulator(param);
  param.set_data(data);
  if (acc) torch::autograd::impl::set_grad_accumulator(param, typename WeakOf<std::decay_t<decltype(acc)>>::type(acc));
}

std::unique_ptr<GradientReducer> makeGradientReducer(PyEngine& engine, std::vector<at::Tensor> params,
                                                     std::vector<std::vector<int64_t>> buckets,
                                                     const GradReducerOptions& options,
                                                     std::shared_ptr<PassCounter> counter) {
  checkParameters(engine, params, "DistributedModel", options.name);
  return std::make_unique<GradientReducer>(engine.engine(), std::move(params), std::move(buckets), options,
                                           std::move(counter));
}

std::unique_ptr<DeltaReducer> makeDeltaReducer(PyEngine& engine, std::vector<at::Tensor> params,
                                               const std::vector<std::vector<int64_t>>& buckets,
                                               const GradReducerOptions& options,
                                               const std::shared_ptr<PassCounter>& counter) {
  checkParameters(engine, params, "DistributedOptimizer", options.name);
  return std::make_unique<DeltaReducer>(engine.engine(), std::move(params), buckets, options, counter);
}

// GradientReducer's options as _C.GradientReducerOptions: every field by its
// name (hvdtorch/training/reducer_options.py fills them); the op as
// Horovod's int (bindField), the codec by name.
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
  bindField(c, ops::field("release_buckets", &O::release_buckets));
  bindField(c, ops::field("unused", &O::unused));
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
}

}  // namespace

void bindGradients(py::module_& m) {
  m.def("set_data_keeping_accumulator", &setDataKeepingAccumulator, py::arg("param"), py::arg("data"),
        "param.data = data, keeping param's gradient accumulator (and so the hooks on it) when the dtype changes");
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
      .def("passes_pending", &GradientReducer::passesPending)
      .def("reset_passes", &GradientReducer::resetPasses, py::arg("backward_passes_per_step") = py::none())
      .def("set_backward_passes_per_step", &GradientReducer::setPassesPerStep)
      .def("view_gradients", &GradientReducer::viewGradients)
      .def("set_sync_enabled", &GradientReducer::setSyncEnabled)
      .def("use_traced_hooks", &GradientReducer::useTracedHooks)
      .def_property_readonly("traced_hooks", &GradientReducer::tracedHooks)
      .def("next_pass_reduces", &GradientReducer::nextPassReduces)
      .def("unused_everywhere", &GradientReducer::unusedEverywhere)
      .def("gradient_ready", &GradientReducer::gradientReady, py::arg("index"), py::arg("grad"),
           py::call_guard<py::gil_scoped_release>())
      .def("backward_ended", &GradientReducer::backwardEnded, py::arg("grads"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "set_pass_callbacks",
          [](GradientReducer& r, py::function at_start, py::function after_drop) {
            r.setPassCallbacks(pythonCallback(std::move(at_start)), pythonCallback(std::move(after_drop)));
          },
          py::arg("at_start"), py::arg("after_drop"))
      .def_property_readonly("counter", &GradientReducer::counter)
      .def("flats", &GradientReducer::flats)
      .def("bucket_bytes", &GradientReducer::bucketBytes);

  // The Adasum optimizer's reducer (delta_reducer.h): backward only counts; reduce_now() reduces.
  py::class_<DeltaReducer>(m, "DeltaReducer")
      .def(py::init(&makeDeltaReducer), py::arg("engine"), py::arg("params"), py::arg("buckets"), py::arg("options"),
           py::arg("counter") = nullptr)
      .def("reduce_now", &DeltaReducer::reduceNow, py::arg("tensors"), py::call_guard<py::gil_scoped_release>())
      .def("passes_pending", &DeltaReducer::passesPending)
      .def("reset_passes", &DeltaReducer::resetPasses, py::arg("backward_passes_per_step") = py::none())
      .def("set_backward_passes_per_step", &DeltaReducer::setPassesPerStep)
      .def("flats", &DeltaReducer::flats)
      .def("bucket_bytes", &DeltaReducer::bucketBytes);

  // The shard rule (gradients/shard_range.h): [start, end) of a bucket's elements set rank `rank` of `size` owns.
  m.def(
      "shard_range",
      [](int64_t numel, int rank, int size) {
        const ShardRange r = shardRange(numel, rank, size);
        return std::make_pair(r.start, r.end);
      },
      py::arg("numel"), py::arg("rank"), py::arg("size"));

  // The packing rule (gradients/bucket_packing.h): (offsets, numel) of a flat bucket of parameters of these sizes.
  m.def(
      "packed_offsets",
      [](const std::vector<int64_t>& numels) {
        BucketPacking p = packBucket(numels);
        return std::make_pair(std::move(p.offsets), p.numel);
      },
      py::arg("numels"));

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
}

}  // namespace hvdtorch
