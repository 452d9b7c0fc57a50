// The 1-step ring all-reduce on device memory (the `ring` reducer for device
// tensors): a reduce-scatter then an all-gather, p-1 steps each, as
// ring_allreduce.h, but every transfer is a device-to-device copy into the
// next rank's inbox, mapped through interprocess memory (CUDA IPC; the
// simulated device's interprocess mode in CI), and every reduction a device
// kernel, all on the engine stream. The host only orders: it never touches
// the data and never waits for the device.
//
// Links: each rank owns one allocation of device memory, mapped by its
// neighbours on this host: an inbox of `slots` slots, written by prev, and
// a page of stream flags (device.h), 32-bit counters: ready[k], which prev's
// stream writes after copying a segment into slot k, and acked[k], which
// next's stream writes after its kernel read a segment this rank copied into
// next's slot k. Every flag a rank's stream waits on is in its own memory.
// Segments are numbered per link, on from one all-reduce to the next (q);
// segment q uses slot k = q % slots. A segment's hand-over:
//   sender:   [slot free: "consumed q-slots" message received]
//             stream: wait acked[k] >= q-slots+1 (own memory); copy into
//             next's slot k; write next's ready[k] = q+1; host: send "data q"
//   receiver: recv "data q"; stream: wait ready[k] >= q+1 (own memory);
//             reduce or copy out of the slot; write prev's acked[k] = q+1;
//             host: send "consumed q"
// The GPU hands over by itself (one stream waits on the flag another
// writes: about 5 us each way between two processes on one H200, where an
// interprocess event took 140 us); the host only enqueues. The 8-byte
// messages on the host links of the data context (shared memory on a host)
// keep two guarantees: a stream waits only for a write a live peer has
// already enqueued (so a stream never hangs on a peer that stopped before
// it got there; the host's receive has the context's deadline and names the
// peer), and the links are left clean for the next algorithm (every message
// is received before allreduce() returns). A peer that dies after enqueuing
// leaves writes that never run: releaseWaits() writes far-ahead values into
// this rank's own flags, from a stream of its own, and the engine calls it
// when it fails, so the streams run on (over data that no longer counts) and
// nothing waits on them forever.
//
// Host-staged links: a neighbour on another host cannot map the inbox, so
// that link carries the data itself. The sender copies the segment into
// one of two pinned host slots (device to host, on the engine stream),
// waits for the copy, and sends the bytes; the receiver receives them into
// one of two pinned host slots of its own, copies them into its inbox slot
// (host to device) and reduces from there as on a mapped link. The host
// waits for the device here, where a mapped link never does. No messages
// travel besides the data: a slot is reused only after the transfer that
// read it has completed, which each side checks for itself (its send's
// request; the event after its copy to the device). Which links are staged
// follows from the topology, the same on every rank.
//
// Teardown: an allocation must not be freed while a peer still has it
// mapped (CUDA IPC leaves that undefined). close(), collective, is the
// handshake: each rank unmaps its neighbours' allocations, sends "closed" to
// each neighbour on this host, and frees its own once theirs arrived. The engine calls it on every rank
// when it stops cleanly, and on every member when a process set is
// removed. After a failure the destructor frees without it, on purpose: a
// peer may be gone, and waiting for it would hang. The failure stops every
// rank's engine, so no peer writes into the inbox any more; a surviving
// peer unmaps it in its own destructor.
//
// Applies when the device supports interprocess memory, or when no two
// neighbours in the ring share a host (every link staged); the same on
// every rank: topology and device kind are agreed. Construction is
// collective (handles are exchanged with the neighbours on this host).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "device/device.h"
#include "transport/context.h"

namespace hvdtorch {

// Whether device tensors may take the device ring at all (HVDTORCH_DEVICE_RING),
// its slot size (HVDTORCH_DEVICE_RING_SLOT_BYTES) and how many slots each
// rank holds (HVDTORCH_DEVICE_RING_SLOTS: segments in flight on a link).
// Each segment costs its two neighbours a hand-over on the GPU, so the
// slots are larger than the host ring's segments.
struct DeviceRingOptions {
  bool enabled = true;
  size_t slot_bytes = 32u << 20;
  uint32_t slots = 2;
};

class DeviceRing {
 public:
  // The most slots an inbox may have (its flags fill 64 bytes).
  static constexpr uint32_t kMaxSlots = 16;

  static bool applicable(const Context& ctx, const Device& device);

  DeviceRing(Context& ctx, Device& device, const DeviceRingOptions& options = DeviceRingOptions());
  ~DeviceRing();
  DeviceRing(const DeviceRing&) = delete;
  DeviceRing& operator=(const DeviceRing&) = delete;

  // In place on `data` (`count` elements of device memory of the device),
  // enqueued on its engine stream; Sum, Min, Max or Product.
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op);

  // Every rank of the context on one host (no staged link anywhere): the
  // same on every rank. `auto` takes the ring only then.
  static bool oneHost(const Context& ctx);

  // The teardown handshake above; the ring serves nothing afterwards.
  // Throws CollectiveError if a neighbour does not answer by the deadline
  // (the inbox is then left to the destructor).
  void close();

  // After a failure: lets every wait this rank's streams issued, or will
  // issue for segments numbered below 2^30 more, pass (see above). Any
  // thread; idempotent; a no-op once closed.
  void releaseWaits();

  // All-reduces run on device rings in this process (tests, diagnostics).
  static uint64_t runs();

 private:
  void send(const char* src, size_t bytes);
  void receive(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op);
  // The same over a host-staged link (to next / from prev).
  void sendStaged(const char* src, size_t bytes);
  void receiveStaged(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op);
  void drain();
  // Flag q % slots_ of a ring allocation (own_, next_mem_ or prev_mem_).
  uint32_t* readyFlag(void* mem, uint64_t q) const;
  uint32_t* ackedFlag(void* mem, uint64_t q) const;
  void unmapNeighbours();
  // Unregisters the host slots and frees them; after a failure
  // (`transfers_may_be_open`), hands them to a staged link instead, which
  // keeps them while a transfer it gave up on may still touch them.
  void freeHostSlots(bool transfers_may_be_open);

  Context& ctx_;
  Device& dev_;
  size_t slot_bytes_;
  uint64_t slots_;
  int next_ = 0, prev_ = 0;
  bool next_staged_ = false, prev_staged_ = false;  // the link crosses hosts
  void* own_ = nullptr;       // mine: slots_ slots written by prev, then the flags (null once closed)
  void* next_mem_ = nullptr;  // next's, opened here (not staged)
  void* prev_mem_ = nullptr;  // prev's, opened here (not staged; next's when p == 2)
  std::mutex release_mu_;     // releaseWaits() against close()
  // Segments sent to next / received from prev, over every all-reduce so far
  // (atomic: releaseWaits() reads them from another thread).
  std::atomic<uint64_t> sent_{0}, received_{0};
  uint64_t acked_ = 0;  // "consumed" messages received from next, likewise
  // p == 2 (next is prev, one link): data messages read while looking for a
  // "consumed" one, in order.
  std::deque<uint64_t> pending_data_;
  // Messages this allreduce sent, kept (with their requests) until delivered.
  std::deque<uint64_t> out_words_;
  uint64_t closed_out_ = 0, closed_in_[2] = {0, 0};  // close()'s messages
  std::vector<std::unique_ptr<LinkRequest>> out_requests_;
  // Staged links: pinned host slots (two to send, two to receive), the
  // pending send of each out slot, and the event after each in slot's copy
  // to the device.
  std::unique_ptr<char[]> host_storage_;
  char* host_ = nullptr;  // host_storage_, page aligned
  std::unique_ptr<LinkRequest> staged_sends_[2];
  std::unique_ptr<Event> copied_;  // after a copy to a host out slot
  std::unique_ptr<Event> landed_[2];
  uint64_t landed_valid_ = 0;  // in slots whose landed_ event is recorded (bit k)
};

}  // namespace hvdtorch
