// The 1-step ring all-reduce on device memory (the `ring` reducer for device
// tensors): a reduce-scatter then an all-gather, p-1 steps each, as
// ring_allreduce.h, but every transfer is a device-to-device copy into the
// next rank's inbox, mapped through interprocess memory (CUDA IPC; the
// simulated device's interprocess mode in CI), and every reduction a device
// kernel, all on the engine stream. The host only orders: it never touches
// the data and never waits for the device.
//
// Links: each rank owns an inbox of two slots (device memory) and, per slot,
// an interprocess "data ready" event (recorded by the previous rank after it
// wrote the slot) and a "consumed" event (recorded by this rank after its
// kernel read the slot). A segment's hand-over:
//   sender:   [slot free: "consumed q-2" message received, its event waited]
//             copy into next's inbox slot q%2; record ready[q%2]; send "data q"
//   receiver: recv "data q"; wait ready[q%2] (prev's); reduce or copy out of
//             the slot; record consumed[q%2]; send "consumed q"
// Every wait on a peer's event is issued after the message that says it was
// recorded, so it binds to that record (a CUDA wait binds to the most recent
// record) and never to an older or absent one. The messages travel on the
// host links of the data context (shared memory on a host), 8 bytes each,
// and every one is received before allreduce() returns, so the links are
// left clean for the next algorithm.
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
// Teardown: an inbox must not be freed while a peer still has it mapped
// (CUDA IPC leaves that undefined). close(), collective, is the handshake:
// each rank unmaps next's inbox, sends "closed" to next, and frees its own
// inbox once prev's "closed" arrived. The engine calls it on every rank
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
#include <vector>

#include "common/dtype.h"
#include "device/device.h"
#include "transport/context.h"

namespace hvdtorch {

// Whether device tensors may take the device ring at all (HVDTORCH_DEVICE_RING),
// and its slot size (HVDTORCH_DEVICE_RING_SLOT_BYTES). Each slot of a step costs
// a handshake between neighbours, so the slots are far larger than the host
// ring's segments: measured on one H200 shared by two ranks, 256 MiB went at
// 6 GB/s bus bandwidth with 1 MiB slots and 96 GB/s with 32 MiB.
struct DeviceRingOptions {
  bool enabled = true;
  size_t slot_bytes = 32u << 20;
};

class DeviceRing {
 public:
  static bool applicable(const Context& ctx, const Device& device);

  DeviceRing(Context& ctx, Device& device, size_t slot_bytes = DeviceRingOptions().slot_bytes);
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

  // All-reduces run on device rings in this process (tests, diagnostics).
  static uint64_t runs();

 private:
  void send(const char* src, size_t bytes);
  void receive(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op);
  // The same over a host-staged link (to next / from prev).
  void sendStaged(const char* src, size_t bytes);
  void receiveStaged(char* dst, size_t bytes, DataType dtype, bool reduce, ReduceOp op);
  void drain();
  // Unregisters the host slots and frees them; after a failure
  // (`transfers_may_be_open`), hands them to a staged link instead, which
  // keeps them while a transfer it gave up on may still touch them.
  void freeHostSlots(bool transfers_may_be_open);

  Context& ctx_;
  Device& dev_;
  size_t slot_bytes_;
  int next_ = 0, prev_ = 0;
  bool next_staged_ = false, prev_staged_ = false;           // the link crosses hosts
  void* inbox_ = nullptr;                                    // mine: two slots, written by prev (null once closed)
  void* next_inbox_ = nullptr;                               // next's, opened here
  std::unique_ptr<Event> ready_[2], consumed_[2];            // mine (interprocess)
  std::unique_ptr<Event> prev_ready_[2], next_consumed_[2];  // the neighbours', opened
  uint64_t sent_ = 0, received_ = 0;  // segments sent to next / received from prev this allreduce
  uint64_t acked_ = 0;                // "consumed" messages received from next this allreduce
  // p == 2 (next is prev, one link): data messages read while looking for a
  // "consumed" one, in order.
  std::deque<uint64_t> pending_data_;
  // Messages this allreduce sent, kept (with their requests) until delivered.
  std::deque<uint64_t> out_words_;
  uint64_t closed_out_ = 0, closed_in_ = 0;  // close()'s messages
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
