// Runs work units, in the order the controller planned them (the same on
// every rank), on the data-plane context. Completes or fails each entry.
//
// What a unit does is its op's: run() calls the execute function of the op's
// row (engine/op_spec.h; each op's in ops/<op>.cc), which uses the context,
// the router (algorithms/router.h: reducers, device routes, device fusion
// memory), the host fusion buffer and the timeline marks below. The
// executor keeps no op's state of its own.
//
// Device tensors: for a row with Staging::kByExecutor, run() swaps a device
// entry's buffers for pinned host copies before execute (host_staging.h),
// and complete() copies the outputs back before the op completes, so an
// op's execute function only ever sees host memory. Ops with device paths
// (kByOp) stage themselves where no device path takes them (the all-reduce
// packs its pieces straight into the fusion buffer, by segments).
#pragma once

#include <deque>
#include <memory>
#include <optional>

#include "algorithms/router.h"
#include "engine/execution/entry.h"
#include "engine/execution/fusion_buffer.h"
#include "engine/execution/host_staging.h"
#include "timeline/timeline.h"
#include "transport/context.h"

namespace hvdtorch {

// How the executor treats device tensors (from the engine's Config).
struct ExecutorOptions {
  // A staged all-reduce of device tensors runs by segments of this many
  // bytes, pipelined: the copies of one segment to or from the device
  // overlap the host reduction of another (HVDTORCH_STAGING_SEGMENT_BYTES;
  // 0: the whole unit at once). Each segment is a collective: the same on
  // every rank.
  size_t staging_segment_bytes = 8 << 20;
};

class Executor {
 public:
  // `router` (the all-reduce's reducers and device routes, on the same
  // context) is owned by the caller and outlives the executor. `registered`
  // (may be null): where the fusion buffer lives, so the node reducer
  // reduces fused units in place.
  Executor(Context& ctx, Router& router, Timeline& timeline, std::shared_ptr<RegisteredMemory> registered = nullptr,
           ExecutorOptions options = {})
      : ctx_(ctx), router_(router), timeline_(timeline), fusion_(std::move(registered)), options_(options) {}
  // Waits for device work still in flight (the router's device fusion
  // memory is freed after this, with the router).
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs one unit. Errors from the transport propagate (the engine then fails
  // everything: ranks may have diverged); errors carried by the unit itself
  // only fail its entries.
  void run(WorkUnit& unit);

  // ---- for the ops' execute functions (on the executor's thread only) ----
  Context& ctx() { return ctx_; }
  Router& router() { return router_; }
  FusionBuffer& fusion() { return fusion_; }
  size_t fusionBytes() const { return fusion_.capacity(); }
  // Completes the piece's entry when it was the entry's last piece.
  void finishPiece(const WorkUnit::Piece& piece);
  // Completes the entry with its outputs (copied back to the device first
  // when the executor staged it). Every execute function finishes its
  // entries through this or finishPiece.
  void complete(Entry& entry);
  // Pinned host memory for this unit (valid until run() returns).
  StagingPool& staging() { return staging_; }
  const ExecutorOptions& options() const { return options_; }

  // ---- device-native paths (ops/allreduce.cc and the others' *OnDevice) ----
  // Keeps `entry` (and the tensors it holds) alive until `done`, recorded on
  // the device's engine stream after the last use of its buffers, completed:
  // device work may outlive the op's completion, the caller's stream waiting
  // on `done` instead of the host.
  void holdUntil(Device& device, std::shared_ptr<Event> done, EntryPtr entry);
  // How a device-native op of one entry ends: its completion event recorded
  // on the engine stream after its work, handed to its state (the caller's
  // stream waits on it), the entry held until it completed, and completed.
  void completeOnDevice(Device& device, const EntryPtr& entry);
  // How an op of Staging::kByOp other than the all-reduce takes its path:
  // host tensors are left as they are (null); for device tensors the
  // router decides (Router::placement: a reducing op passes its reduced
  // op), and where it answers null they are staged through pinned host
  // memory (StagedEntry::stageIn). Returns the device to run on, or null.
  Device* deviceOrStage(Entry& entry, std::optional<ReduceOp> reduce = std::nullopt);
  // Runs host reducer `reducer` over data[0 .. count) on the executor's
  // context: the router's ReducerSet::allreduce (timed into `auto`'s model),
  // marked as the unit's ALLREDUCE:<reducer> phase on the timeline and, where
  // `times` is given, as its reduce phase; nothing to exchange on one rank.
  // `in` (not null, not data): the input, reduced into data (out of place:
  // Reducer::allreduceInto).
  void reduceOnHost(const WorkUnit& unit, Reducer& reducer, void* data, size_t count, DataType dtype, ReduceOp op,
                    OpTimes* times = nullptr, const void* in = nullptr);
  // What the reducers run for `op`, and what the result is divided by.
  static ReduceOp reducedOp(ReduceOp op);
  int64_t averageDivisor(ReduceOp op) const;
  // Marks `phase` begun (or ended) for every op of the unit.
  void mark(const WorkUnit& unit, const std::string& phase, bool begin);

 private:
  Context& ctx_;
  Router& router_;
  Timeline& timeline_;
  FusionBuffer fusion_;
  StagingPool staging_;
  ExecutorOptions options_;
  struct InFlight {
    Device* device;
    std::shared_ptr<Event> done;
    EntryPtr entry;
  };
  std::deque<InFlight> in_flight_;
  void releaseFinished();
};

// Elements of one row (everything but dimension 0) of `shape`.
size_t rowElems(const std::vector<int64_t>& shape);

}  // namespace hvdtorch
