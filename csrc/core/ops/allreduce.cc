#include "ops/allreduce.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>

#include "algorithms/device_ring.h"
#include "algorithms/reducer_registry.h"
#include "common/error.h"
#include "device/devices.h"
#include "device/reduce_kernels.h"
#include "engine/execution/host_staging.h"
#include "ops/allreduce_staged.h"
#include "ops/op_common.h"
#include "ops/op_table.h"
#include "transport/shm/registered_memory.h"

namespace hvdtorch::ops {

namespace {

// Whether every tensor of the op is its own output and lies in this rank's
// registered memory (DistributedModel's buckets, the sharded optimizer's
// flat parameters): a fact the router's choice reads (ReducerSet::forRequest).
bool registeredInPlace(const Engine& engine, const AllreduceOptions& opts) {
  const auto& registered = engine.registered();
  if (!registered || opts.outputs.size() != opts.inputs.size()) return false;
  for (size_t i = 0; i < opts.inputs.size(); ++i) {
    TensorBuffer& in = *opts.inputs[i];
    RegisteredRef where;
    if (in.device().kind != DeviceKind::kCpu || in.data() != opts.outputs[i]->data() ||
        !registered->find(in.data(), in.bytes(), &where))
      return false;
  }
  return true;
}

}  // namespace

ReduceArgs allreduceArgs(const Engine& engine, const AllreduceOptions& opts) {
  const OpWhere where{engine, OpType::kAllreduce, opts.name};
  ReduceArgs args = reduceArgs(where, opts.op, opts.prescale, opts.postscale, opts.inputs);
  try {
    args.reducer = parseReducer(opts.reducer.empty() ? engine.config().reducer : opts.reducer);
    // A reducer that defines its own op (Adasum) makes a Sum or Average that op.
    if (args.reducer != kAutoReducer) {
      const auto& own = reducerRegistry()[args.reducer].own_op;
      if (own && (args.op == ReduceOp::kSum || args.op == ReduceOp::kAverage)) args.op = *own;
    }
    // The reducers run Average as a Sum.
    const ReduceOp reduced = args.op == ReduceOp::kAverage ? ReduceOp::kSum : args.op;
    const auto ps = engine.processSet(opts.process_set_id);
    const ReducerSet& reducers = ps && ps->member() ? ps->router->reducers() : engine.reducers();
    const Context& ctx = ps && ps->member() ? *ps->data : engine.dataContext();
    args.reducer = reducers.forRequest(args.reducer, args.op, [&] { return registeredInPlace(engine, opts); });
    for (const auto& t : opts.inputs) reducers.check(args.reducer, ctx, t->dtype(), reduced);
  } catch (const InvalidArgument& err) {
    throw InvalidArgument(strCat(where.str(), ": ", err.what()));
  }
  // Adasum's dot products are per tensor: never fuse it with other tensors.
  args.fuse = opts.fuse && args.op != ReduceOp::kAdasum;
  return args;
}

int64_t allreduce(Engine& engine, AllreduceOptions opts) {
  OpEntry op(engine, AllreduceOptions::kType, opts.name, opts.process_set_id);
  if (opts.inputs.empty() || opts.inputs.size() != opts.outputs.size())
    op.fail("needs as many outputs as inputs, and at least one");
  for (size_t i = 0; i < opts.inputs.size(); ++i) {
    const TensorBuffer& in = *opts.inputs[i];
    const TensorBuffer& out = *opts.outputs[i];
    if (in.numel() != out.numel() || in.dtype() != out.dtype()) op.fail("output ", i, " does not match its input");
  }
  ReduceArgs args = allreduceArgs(engine, opts);
  return op.submit(std::move(opts.inputs), std::move(opts.outputs), nullptr, args);
}

namespace {

// The unit's one device, for the device all-reduce routes (the route itself
// is chosen by the router, algorithms/device_router.h), or null where its
// pieces are on several devices; `several` then says so, and the router
// throws it where a device route would take the unit (staging through the
// host takes pieces on any devices).
Device* unitDevice(const WorkUnit& unit, ReducerId asked, std::string& several) {
  const DeviceId id = unit.pieces.front().entry->inputs[unit.pieces.front().tensor]->device();
  for (const auto& p : unit.pieces)
    if (p.entry->inputs[p.tensor]->device() != id) {
      several = strCat(p.entry->request.describe(), ": tensors fused into one ", reducerName(asked),
                       " all-reduce are on ", id.str(), " and ", p.entry->inputs[p.tensor]->device().str(),
                       "; the device paths need one device per process");
      return nullptr;
    }
  return &deviceFor(id);
}

// Finishes every piece of `unit` without the host waiting for its device:
// one completion event per device, recorded on its engine stream after what
// the op enqueued there, which the caller's stream waits on; the entries are
// held until it has passed.
void finishOnDevices(Executor& ex, WorkUnit& unit) {
  std::map<Device*, std::shared_ptr<Event>> done;
  for (const auto& p : unit.pieces) {
    Device& d = deviceFor(p.entry->inputs[p.tensor]->device());
    std::shared_ptr<Event>& event = done[&d];
    if (!event) {
      event = d.newEvent();
      d.record(*event, nullptr);
    }
    p.entry->state->device = d.id();
    p.entry->state->completion = event;
    ex.holdUntil(d, event, p.entry);
  }
  for (const auto& p : unit.pieces) ex.finishPiece(p);
}

// Device memory only: pack (prescaled) into the router's device fusion buffer
// (a lone tensor is reduced in its output), reduce, unpack (averaged,
// postscaled), all on the engine stream; the op completes without the host
// waiting for the device (finishOnDevices).
void allreduceOnDevice(Executor& ex, WorkUnit& unit, const AllreduceRoute& path, DataType dtype, size_t count) {
  Device& d = *path.device;
  const ReduceArgs& args = unit.pieces.front().entry->request.payload<ReduceArgs>();
  const size_t esize = dtypeSize(dtype);
  const bool alone = unit.pieces.size() == 1;
  char* fused = alone ? static_cast<char*>(unit.pieces.front().entry->outputs[unit.pieces.front().tensor]->data())
                      : static_cast<char*>(ex.router().deviceFusion(d, count * esize));
  size_t off = 0;
  ex.mark(unit, "MEMCPY_IN_FUSION", true);
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    waitReady(d, {p.entry->inputs[p.tensor], p.entry->outputs[p.tensor]});
    d.copyScaled(fused + off * esize, in.data(), static_cast<size_t>(in.numel()), dtype, args.prescale, nullptr);
    off += static_cast<size_t>(in.numel());
  }
  ex.mark(unit, "MEMCPY_IN_FUSION", false);
  const char* phase = path.ring ? "ALLREDUCE:ring(device)" : "ALLREDUCE:native(device)";
  const ReduceOp op = Executor::reducedOp(args.op);
  ex.mark(unit, phase, true);
  if (path.ring) {
    path.ring->allreduce(fused, count, dtype, op);
  } else {
    ex.ctx().native()->allreduceOnDevice(d, fused, count, dtype, op);
  }
  ex.mark(unit, phase, false);
  const int64_t divisor = ex.averageDivisor(args.op);
  off = 0;
  for (const auto& p : unit.pieces) {
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    d.copyAveraged(out.data(), fused + off * esize, static_cast<size_t>(out.numel()), dtype, divisor, args.postscale,
                   nullptr);
    off += static_cast<size_t>(out.numel());
  }
  finishOnDevices(ex, unit);
}

// Device pieces staged through the pinned fusion buffer (reduceStaged,
// allreduce_staged.h): the copies from the device land in the memory the
// reducers, and with the node reducer the peers, read.
void allreduceStaged(Executor& ex, WorkUnit& unit, Reducer& reducer, DataType dtype, size_t count) {
  const ReduceArgs& args = unit.pieces.front().entry->request.payload<ReduceArgs>();
  std::vector<StagedPart> parts;
  parts.reserve(unit.pieces.size());
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    Device& dev = deviceFor(in.device());
    waitReady(dev, {p.entry->inputs[p.tensor], p.entry->outputs[p.tensor]});
    const size_t at = parts.empty() ? 0 : parts.back().end;
    parts.push_back({&dev, in.data(), p.entry->outputs[p.tensor]->data(), at, at + static_cast<size_t>(in.numel())});
  }
  const auto done = reduceStaged(ex, parts, reducer, dtype, count, Executor::reducedOp(args.op),
                                 {args.prescale, args.postscale, ex.averageDivisor(args.op)},
                                 [&](const std::string& phase, bool begin) { ex.mark(unit, phase, begin); });
  for (size_t i = 0; i < unit.pieces.size(); ++i) {
    unit.pieces[i].entry->state->device = parts[i].device->id();
    unit.pieces[i].entry->state->completion = done.at(parts[i].device);
  }
  for (const auto& p : unit.pieces) ex.finishPiece(p);
}

std::atomic<uint64_t> one_rank_device_runs{0};

// One rank: there is nothing to exchange, so device tensors stay on their
// device (staging would move every byte through the host twice for nothing):
// each output is its input prescaled, averaged over one rank and postscaled,
// on the engine stream; an in-place all-reduce with no scaling enqueues
// nothing. Completes as allreduceOnDevice does (finishOnDevices).
void allreduceOneRank(Executor& ex, WorkUnit& unit, DataType dtype) {
  const ReduceArgs& args = unit.pieces.front().entry->request.payload<ReduceArgs>();
  const int64_t divisor = ex.averageDivisor(args.op);
  ex.mark(unit, "ALLREDUCE:one rank(device)", true);
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    Device& d = deviceFor(in.device());
    waitReady(d, {p.entry->inputs[p.tensor], p.entry->outputs[p.tensor]});
    const size_t n = static_cast<size_t>(in.numel());
    if (out.data() != in.data() || args.prescale != 1.0)
      d.copyScaled(out.data(), in.data(), n, dtype, args.prescale, nullptr);
    if (divisor != 1 || args.postscale != 1.0)
      d.copyAveraged(out.data(), out.data(), n, dtype, divisor, args.postscale, nullptr);
  }
  ex.mark(unit, "ALLREDUCE:one rank(device)", false);
  one_rank_device_runs.fetch_add(1);
  finishOnDevices(ex, unit);
}

}  // namespace

uint64_t oneRankDeviceAllreduces() { return one_rank_device_runs.load(); }

void executeAllreduce(Executor& ex, WorkUnit& unit) {
  const Request& req = unit.pieces.front().entry->request;
  const ReduceArgs& args = req.payload<ReduceArgs>();
  const TensorSpec& spec = req.tensors[unit.pieces.front().tensor];
  const DataType dtype = spec.dtype;
  const bool on_device = spec.device !=
                         DeviceKind::kCpu;  // the same for every piece (engine/negotiation/fusion_plan.h)
  size_t count = 0;
  for (const auto& p : unit.pieces) count += static_cast<size_t>(p.entry->request.tensors[p.tensor].numel());
  const ReduceOp op = Executor::reducedOp(args.op);
  AllreduceQuery query;
  query.asked = args.reducer;
  query.dtype = dtype;
  query.op = op;
  query.bytes = count * dtypeSize(dtype);
  if (on_device) {
    query.on_device = true;
    query.device = unitDevice(unit, args.reducer, query.several_devices);
    // The calibration's staged route is this op's staging (allreduce_staged.h).
    query.run_staged = [&ex](Device& d, void* buf, size_t n, Reducer& host) {
      reduceStaged(ex, {{&d, buf, buf, 0, n}}, host, DataType::kFloat32, n, ReduceOp::kSum, {},
                   [](const std::string&, bool) {});
    };
    // The first `auto` all-reduce of a device may time its routes
    // (algorithms/device_router.h): a phase of this op on the timeline.
    query.calibrating = [&ex, &unit](bool begin) { ex.mark(unit, "DEVICE_CALIBRATION", begin); };
  }
  const AllreduceRoute route = ex.router().route(query);
  if (route.device) return allreduceOnDevice(ex, unit, route, dtype, count);
  if (route.alone) return allreduceOneRank(ex, unit, dtype);
  Reducer& reducer = *route.host;
  if (on_device) return allreduceStaged(ex, unit, reducer, dtype, count);

  const int64_t divisor = ex.averageDivisor(args.op);
  if (unit.pieces.size() == 1) {
    // One host tensor: reduce straight in the output, no fusion-buffer
    // copies; out of place and unscaled, the reducer reads the input itself.
    const auto& p = unit.pieces.front();
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    const bool reads_input = args.prescale == 1.0 && in.data() != out.data();
    if (!reads_input) copyScaled(out.data(), in.data(), count, dtype, args.prescale);
    ex.reduceOnHost(unit, reducer, out.data(), count, dtype, op, &p.entry->state->times,
                    reads_input ? in.data() : nullptr);
    copyAveraged(out.data(), out.data(), count, dtype, divisor, args.postscale);
    ex.finishPiece(p);
    return;
  }

  const size_t esize = dtypeSize(dtype);
  char* fused = static_cast<char*>(ex.fusion().reserve(count * esize));
  size_t off = 0;
  ex.mark(unit, "MEMCPY_IN_FUSION", true);
  for (const auto& p : unit.pieces) {
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    const size_t n = static_cast<size_t>(in.numel());
    copyScaled(fused + off * esize, in.data(), n, dtype, args.prescale);
    off += n;
  }
  ex.mark(unit, "MEMCPY_IN_FUSION", false);
  ex.reduceOnHost(unit, reducer, fused, count, dtype, op);
  ex.mark(unit, "MEMCPY_OUT_FUSION", true);
  off = 0;
  for (const auto& p : unit.pieces) {
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    const size_t n = static_cast<size_t>(out.numel());
    copyAveraged(out.data(), fused + off * esize, n, dtype, divisor, args.postscale);
    off += n;
  }
  ex.mark(unit, "MEMCPY_OUT_FUSION", false);
  for (const auto& p : unit.pieces) ex.finishPiece(p);
}

// Its row of the op table (engine/op_spec.h says what each column means).
const OpSpec& allreduceRow() {
  static const OpSpec row = {OpType::kAllreduce,
                             "allreduce",
                             argsIndex<ReduceArgs>(),
                             planIndex<NoPlan>(),
                             /*first_dim_free=*/false,
                             /*cacheable=*/true,
                             /*fuses=*/true,
                             InlineRun::kIfSmall,
                             WhileJoined::kAddsZeros,
                             Outputs::kLikeInputs,
                             Staging::kByOp,
                             /*make_plan=*/nullptr,
                             /*execute=*/executeAllreduce};
  return row;
}

}  // namespace hvdtorch::ops
