#include "ops/allreduce.h"

#include <algorithm>
#include <functional>
#include <map>

#include "algorithms/device_ring.h"
#include "algorithms/reducer_registry.h"
#include "common/error.h"
#include "device/devices.h"
#include "device/reduce_kernels.h"
#include "engine/host_staging.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

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
    const ReducerSet& reducers = ps && ps->member() ? *ps->reducers : engine.reducers();
    const Context& ctx = ps && ps->member() ? *ps->data : engine.dataContext();
    for (const auto& t : opts.inputs) reducers.check(args.reducer, ctx, t->dtype(), reduced);
  } catch (const InvalidArgument& err) {
    throw InvalidArgument(strCat(where.str(), ": ", err.what()));
  }
  // Adasum's dot products are per tensor: never fuse it with other tensors.
  args.fuse = opts.fuse && args.op != ReduceOp::kAdasum;
  return args;
}

int64_t allreduce(Engine& engine, AllreduceOptions opts) {
  const OpWhere where{engine, OpType::kAllreduce, opts.name};
  checkProcessSet(where, opts.process_set_id);
  if (opts.inputs.empty() || opts.inputs.size() != opts.outputs.size())
    throw InvalidArgument(strCat(where.str(), ": needs as many outputs as inputs, and at least one"));
  checkOneDevice(where, opts.inputs, opts.outputs);
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kAllreduce;
  q.process_set_id = opts.process_set_id;
  q.tensors.reserve(opts.inputs.size());
  for (size_t i = 0; i < opts.inputs.size(); ++i) {
    const TensorBuffer& in = *opts.inputs[i];
    const TensorBuffer& out = *opts.outputs[i];
    if (in.numel() != out.numel() || in.dtype() != out.dtype())
      throw InvalidArgument(strCat(where.str(), ": output ", i, " does not match its input"));
    q.tensors.push_back(specOf(in));
  }
  q.args = allreduceArgs(engine, opts);
  q.name = std::move(opts.name);
  e->inputs = std::move(opts.inputs);
  e->outputs = std::move(opts.outputs);
  return engine.submit(std::move(e));
}

namespace {

// The devices a staged unit's pieces are on, and their engine streams' drain.
struct DeviceStaging {
  std::vector<Device*> devices;  // each device the unit's pieces are on, once

  Device& use(DeviceId id) {
    Device& d = deviceFor(id);
    if (std::find(devices.begin(), devices.end(), &d) == devices.end()) devices.push_back(&d);
    return d;
  }
  std::map<Device*, std::shared_ptr<Event>> drain() {
    std::map<Device*, std::shared_ptr<Event>> done;
    for (Device* d : devices) done[d] = drainEngineStream(*d);
    return done;
  }
};

// The device-native paths reduce device memory without the host: the
// backend's device collectives (`native`, or `auto` wherever they serve:
// NCCL on CUDA with one GPU per rank, what DDP runs, and the tested path)
// and the device ring (device_ring.h; `ring`, or `auto` on one host where
// the backend does not serve, as for ranks sharing a GPU: there it moves
// each byte once device to device, where staging moves it to the host and
// back as well). Both need every piece on one device. What applies is agreed
// across ranks (the device kind, dtype and op are in the signature;
// applicability is decided collectively on first use, in this order on
// every rank), except the device index, this rank's own.
struct DevicePath {
  Device* device = nullptr;  // null: stage through the host
  bool ring = false;         // the device ring; else the backend's device collectives
};

DevicePath devicePath(Executor& ex, const WorkUnit& unit, ReducerId asked, DataType dtype, ReduceOp op) {
  static const ReducerId ring = parseReducer("ring");
  static const ReducerId native = parseReducer("native");
  if (asked != ring && asked != native && asked != kAutoReducer) return {};
  const DeviceId id = unit.pieces.front().entry->inputs[unit.pieces.front().tensor]->device();
  for (const auto& p : unit.pieces)
    if (p.entry->inputs[p.tensor]->device() != id)
      throw CollectiveError(strCat(p.entry->request.describe(), ": tensors fused into one ", reducerName(asked),
                                   " all-reduce are on ", id.str(), " and ", p.entry->inputs[p.tensor]->device().str(),
                                   "; the device paths need one device per process"));
  Device& d = deviceFor(id);
  NativeCollectives* backend = ex.ctx().native();
  if (asked != ring && backend && backend->reducesOnDevice(d, dtype, op)) return {&d, false};
  // `auto` takes the ring on one host only (each byte moves once, device to
  // device); across hosts its links stage through the host one segment at
  // a time, where the staged node reducer reduces on the host in parallel.
  const bool ring_allowed = asked == ring || (asked == kAutoReducer && DeviceRing::oneHost(ex.ctx()));
  if (ring_allowed && ex.deviceRing(d)) return {&d, true};
  return {};
}

// Device memory only: pack (prescaled) into the engine's device fusion buffer
// (a lone tensor is reduced in its output), reduce, unpack (averaged,
// postscaled), all on the engine stream; the op completes without the host
// waiting for the device, the caller's stream waiting on `done` instead.
void allreduceOnDevice(Executor& ex, WorkUnit& unit, const DevicePath& path, DataType dtype, size_t count) {
  Device& d = *path.device;
  const ReduceArgs& args = unit.pieces.front().entry->request.reduce();
  const size_t esize = dtypeSize(dtype);
  const bool alone = unit.pieces.size() == 1;
  char* fused = alone ? static_cast<char*>(unit.pieces.front().entry->outputs[unit.pieces.front().tensor]->data())
                      : static_cast<char*>(ex.deviceFusion(d, count * esize));
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
    ex.deviceRing(d)->allreduce(fused, count, dtype, op);
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
  std::shared_ptr<Event> done = d.newEvent();
  d.record(*done, nullptr);
  for (const auto& p : unit.pieces) {
    p.entry->state->device = d.id();
    p.entry->state->completion = done;
    ex.holdUntil(d, done, p.entry);
  }
  for (const auto& p : unit.pieces) ex.finishPiece(p);
}

// Device pieces staged through the fusion buffer (pinned: the copies from
// the device land in the memory the reducers, and with the node reducer the
// peers, read), by segments of ExecutorOptions::staging_segment_bytes: all
// copies to the host are enqueued at once, with an event after each
// segment's; segment s is then scaled, reduced (one collective per segment,
// the same segments on every rank) and copied back while the device still
// copies segments s + 1, ... to the host. Prescale and postscale run on the
// host, one pass each per segment. Adasum's dot products span whole
// tensors: it runs as one segment.
void allreduceStaged(Executor& ex, WorkUnit& unit, Reducer& reducer, DataType dtype, size_t count) {
  const ReduceArgs& args = unit.pieces.front().entry->request.reduce();
  const ReduceOp op = Executor::reducedOp(args.op);
  const int64_t divisor = ex.averageDivisor(args.op);
  const size_t esize = dtypeSize(dtype);
  const size_t segment_bytes = ex.options().staging_segment_bytes;
  const size_t seg = segment_bytes == 0 || op == ReduceOp::kAdasum ? count : std::max<size_t>(1, segment_bytes / esize);
  const size_t segments = std::max<size_t>(1, (count + seg - 1) / seg);
  DeviceStaging staging;
  char* fused = static_cast<char*>(ex.fusion().reserve(
      count * esize, &staging.use(unit.pieces.front().entry->inputs[unit.pieces.front().tensor]->device())));
  // Where each piece starts and ends in the fused buffer, and its device.
  std::vector<size_t> at, end;
  std::vector<Device*> device_of;
  for (const auto& p : unit.pieces) {
    at.push_back(end.empty() ? 0 : end.back());
    end.push_back(at.back() + static_cast<size_t>(p.entry->inputs[p.tensor]->numel()));
    device_of.push_back(&staging.use(p.entry->inputs[p.tensor]->device()));
  }
  // Calls f(piece, first, last) for the elements [first, last) of the fused
  // buffer that a piece holds within [lo, hi), from the first piece ending
  // after lo (ends ascend): a segment visits only the pieces it overlaps.
  auto forEachPart = [&](size_t lo, size_t hi, const std::function<void(size_t, size_t, size_t)>& f) {
    for (auto i = static_cast<size_t>(std::upper_bound(end.begin(), end.end(), lo) - end.begin());
         i < unit.pieces.size() && at[i] < hi; ++i) {
      const size_t first = std::max(lo, at[i]);
      const size_t last = std::min(hi, end[i]);
      if (first < last) f(i, first, last);
    }
  };

  ex.mark(unit, "MEMCPY_IN_FUSION", true);
  for (size_t i = 0; i < unit.pieces.size(); ++i) {
    const auto& p = unit.pieces[i];
    waitReady(*device_of[i], {p.entry->inputs[p.tensor], p.entry->outputs[p.tensor]});
  }
  // copied[s]: an event on each device that copies part of segment s.
  std::vector<std::vector<std::pair<Device*, std::shared_ptr<Event>>>> copied(segments);
  for (size_t s = 0; s < segments; ++s) {
    std::vector<Device*> used;
    forEachPart(s * seg, std::min(count, (s + 1) * seg), [&](size_t i, size_t first, size_t last) {
      const auto& p = unit.pieces[i];
      const char* in = static_cast<const char*>(p.entry->inputs[p.tensor]->data());
      device_of[i]->copyToHost(fused + first * esize, in + (first - at[i]) * esize, (last - first) * esize, nullptr);
      if (std::find(used.begin(), used.end(), device_of[i]) == used.end()) used.push_back(device_of[i]);
    });
    for (Device* d : used) {
      copied[s].emplace_back(d, d->newEvent());
      d->record(*copied[s].back().second, nullptr);
    }
  }
  ex.mark(unit, "MEMCPY_IN_FUSION", false);

  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  ex.mark(unit, collective, true);
  for (size_t s = 0; s < segments; ++s) {
    const size_t lo = s * seg;
    const size_t n = std::min(count, lo + seg) - lo;
    char* data = fused + lo * esize;
    for (auto& [d, event] : copied[s]) d->synchronize(*event);
    copyScaled(data, data, n, dtype, args.prescale);
    if (ex.ctx().size() > 1)
      ex.reducers().allreduce(ex.ctx(), reducer, data, n, dtype, op);  // timed into `auto`'s model
    copyAveraged(data, data, n, dtype, divisor, args.postscale);
    forEachPart(lo, lo + n, [&](size_t i, size_t first, size_t last) {
      const auto& p = unit.pieces[i];
      char* out = static_cast<char*>(p.entry->outputs[p.tensor]->data());
      device_of[i]->copyFromHost(out + (first - at[i]) * esize, fused + first * esize, (last - first) * esize, nullptr);
    });
  }
  ex.mark(unit, collective, false);
  // The fusion buffer is reused by the next unit: the copies must be done.
  ex.mark(unit, "MEMCPY_OUT_FUSION", true);
  const auto done = staging.drain();
  for (size_t i = 0; i < unit.pieces.size(); ++i) {
    unit.pieces[i].entry->state->device = device_of[i]->id();
    unit.pieces[i].entry->state->completion = done.at(device_of[i]);
  }
  ex.mark(unit, "MEMCPY_OUT_FUSION", false);
  for (const auto& p : unit.pieces) ex.finishPiece(p);
}

}  // namespace

void executeAllreduce(Executor& ex, WorkUnit& unit) {
  const Request& req = unit.pieces.front().entry->request;
  const ReduceArgs& args = req.reduce();
  const TensorSpec& spec = req.tensors[unit.pieces.front().tensor];
  const DataType dtype = spec.dtype;
  const bool on_device = spec.device != DeviceKind::kCpu;  // the same for every piece (fusion.h)
  size_t count = 0;
  for (const auto& p : unit.pieces) count += static_cast<size_t>(p.entry->request.tensors[p.tensor].numel());
  const ReduceOp op = Executor::reducedOp(args.op);
  if (on_device && ex.ctx().size() > 1) {
    const DevicePath path = devicePath(ex, unit, args.reducer, dtype, op);
    if (path.device) return allreduceOnDevice(ex, unit, path, dtype, count);
  }
  Reducer& reducer = ex.reducers().pick(args.reducer, ex.ctx(), count * dtypeSize(dtype), dtype, op);
  if (on_device) return allreduceStaged(ex, unit, reducer, dtype, count);

  const int64_t divisor = ex.averageDivisor(args.op);
  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  if (unit.pieces.size() == 1) {
    // One host tensor: reduce straight in the output, no fusion-buffer copies.
    const auto& p = unit.pieces.front();
    TensorBuffer& in = *p.entry->inputs[p.tensor];
    TensorBuffer& out = *p.entry->outputs[p.tensor];
    copyScaled(out.data(), in.data(), count, dtype, args.prescale);
    ex.mark(unit, collective, true);
    p.entry->state->times.reduce_begun = OpTimes::now();
    if (ex.ctx().size() > 1)
      ex.reducers().allreduce(ex.ctx(), reducer, out.data(), count, dtype, op);  // timed into `auto`'s model
    p.entry->state->times.reduce_ended = OpTimes::now();
    ex.mark(unit, collective, false);
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
  ex.mark(unit, collective, true);
  if (ex.ctx().size() > 1)
    ex.reducers().allreduce(ex.ctx(), reducer, fused, count, dtype, op);  // timed into `auto`'s model
  ex.mark(unit, collective, false);
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

}  // namespace hvdtorch::ops
