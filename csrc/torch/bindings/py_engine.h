// One rank's engine (csrc/core/engine/engine.h) as Python holds it,
// _C.Engine. It converts types only -- torch tensors and process groups to the
// core's buffers and links, Python values to core enums -- and calls the
// core's per-op entry functions (csrc/core/ops), which hold every check and
// policy. bind_engine.cpp binds it; the gradient bindings take it as the
// engine a GradientReducer runs on.
#pragma once

#include <torch/extension.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "c10d_link.h"
#include "common/error.h"
#include "engine/engine.h"
#include "tensor_binding.h"

namespace hvdtorch {

// The prefix of an op's errors: "rank 2: allreduce 'grad.w'".
std::string opWhere(int rank, const char* op, const std::string& name);

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
const at::Tensor& onlyTensor(const std::string& where, const char* what, const std::vector<at::Tensor>& ts);

// Outputs of an op without input tensors (join's int32 scalar): CPU tensors,
// never device buffers.
OutputAllocator cpuAllocator();

class PyEngine {
 public:
  PyEngine(const std::map<std::string, std::string>& options, int rank, const std::vector<int>& host_of_rank,
           c10::intrusive_ptr<c10d::ProcessGroup> control_pg, c10::intrusive_ptr<c10d::ProcessGroup> data_pg,
           const std::string& shm_token, std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg);

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
                        std::optional<c10::intrusive_ptr<c10d::ProcessGroup>> device_pg);
  // Refused while the set has ops outstanding here; waits for the peers' device ring teardown.
  void removeProcessSet(int32_t id);
  // id -> global ranks, for every set this rank knows (members or not).
  std::map<int32_t, std::vector<int>> processSets() const;

  bool poll(int64_t handle) { return engine_->state(handle)->done(); }
  // Waits (without the GIL) for the op, then returns its outputs or raises.
  // Wakes every 100 ms to let Ctrl-C through.
  std::vector<at::Tensor> wait(int64_t handle);

  void startTimeline(const std::string& path, bool mark_cycles);
  void shutdown();

  pybind11::dict topology() const;
  // peer -> transport kinds of the data links used so far.
  pybind11::dict linkKinds();
  // The phases (op_timing.h) of the last ops waited for, in nanoseconds:
  // {phase: [one value per op, oldest first]}, -1 where not stamped.
  // clear=True forgets them afterwards.
  pybind11::dict latencyPhases(bool clear);
  // Negotiation rounds so far (every process set): how many were settled by
  // the decentralized AND alone, how many went through a coordinator.
  pybind11::dict negotiationStats() const;
  // reducer -> (alpha seconds, beta seconds per byte): the line through the
  // auto cost model's estimates at 4 KiB and 256 MiB (a summary; the model
  // itself is per size band, see reducerChoices).
  pybind11::dict costModel();
  // The link between hosts as calibration measured it: {latency_s,
  // bytes_per_s}; None on one host or without calibration.
  pybind11::object linkCost();
  // Per size band of the auto cost model: its size, the reducer auto runs
  // for float32 Sum, and per reducer the agreed estimate (seconds; None
  // until measured) and the samples seen.
  pybind11::list reducerChoices();
  std::string chooseReducer(size_t bytes, at::ScalarType dtype);

  const std::shared_ptr<Engine>& engine() const { return engine_; }

 private:
  int rank() const { return engine_->topo().rank; }

  std::unique_ptr<C10dNative> native_;
  std::map<int32_t, std::unique_ptr<C10dNative>> set_natives_;  // process set id -> its groups' collectives
  std::shared_ptr<Engine> engine_;
};

}  // namespace hvdtorch
