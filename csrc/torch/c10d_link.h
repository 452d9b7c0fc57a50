// The c10d transport: a Link and the NativeCollectives over a
// c10d::ProcessGroup (Gloo on CPU; NCCL for device memory, through
// c10d_device_collectives.h). Gloo is used through ProcessGroup, never
// linked directly: the torch wheel ships no Gloo headers and a second copy
// would clash with the one inside libtorch_cpu.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <mutex>
#include <vector>

#include "c10d_deadline_watch.h"
#include "c10d_device_collectives.h"
#include "transport/link.h"
#include "transport/native_collectives.h"

namespace hvdtorch {

// Point-to-point messages to one peer through pg->send/recv. Each direction
// numbers its messages and puts the number in the Gloo tag, so every message
// has its own slot and matching never depends on Gloo's queueing order.
//
// `channel` (0 .. kChannels-1) lets several independent streams share one
// process group: the tag is (sequence << kChannelBits) | channel, so links
// of different channels between the same two ranks never match each
// other's messages (each process set talks on channels of its own).
//
// With a `watch`, a wait that reaches its deadline is aborted
// (c10d_deadline_watch.h) and the rest of the group's connections stay
// open; the aborted transfer is kept until the link goes. Without one, Gloo
// times the wait out itself and closes every connection of the group: what
// the data links want (the peers waiting on this rank learn at once), not
// the control links, which must still carry this rank's last word.
class C10dLink : public Link {
 public:
  static constexpr int kChannelBits = 12;
  static constexpr int kChannels = 1 << kChannelBits;

  // Transfers given up at their deadline, still posted in Gloo: kept as
  // long as the link (their requests may outlive it: they hold it weakly).
  struct Aborted {
    std::mutex mu;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
  };

  C10dLink(c10::intrusive_ptr<c10d::ProcessGroup> pg, int peer, int channel = 0,
           std::shared_ptr<DeadlineWatch> watch = nullptr);
  int peer() const override { return peer_; }
  const char* kind() const override { return "c10d"; }
  std::unique_ptr<LinkRequest> isend(const void* data, size_t bytes) override;
  std::unique_ptr<LinkRequest> irecv(void* data, size_t bytes) override;

 private:
  int tagOf(uint32_t seq) const {
    return static_cast<int>(((seq & kSeqMask) << kChannelBits) | static_cast<uint32_t>(channel_));
  }
  // Tags must be non-negative ints: 31 bits, of which kChannelBits name the channel.
  static constexpr uint32_t kSeqMask = (1u << (31 - kChannelBits)) - 1;
  std::unique_ptr<LinkRequest> request(c10::intrusive_ptr<c10d::Work> work, at::Tensor keep, const char* what);
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  int peer_;
  int channel_;
  std::shared_ptr<DeadlineWatch> watch_;
  std::shared_ptr<Aborted> aborted_ = std::make_shared<Aborted>();
  uint32_t send_seq_ = 0;
  uint32_t recv_seq_ = 0;
};

// Sum, Min, Max, Product; throws InvalidArgument for the others.
c10d::ReduceOp toC10dOp(ReduceOp op);

// The data group's collectives on host memory, and on device memory through
// `device` where there is a device group (c10d_device_collectives.h).
class C10dNative : public NativeCollectives {
 public:
  explicit C10dNative(c10::intrusive_ptr<c10d::ProcessGroup> pg,
                      std::unique_ptr<C10dDeviceCollectives> device = nullptr)
      : pg_(std::move(pg)), device_(std::move(device)) {}
  bool supports(DataType dtype, ReduceOp op) const override;
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void barrier() override;
  bool reducesOnDevice(Device& device, DataType dtype, ReduceOp op) override {
    return device_ && device_->reduces(device, dtype, op);
  }
  void allreduceOnDevice(Device& device, void* data, size_t count, DataType dtype, ReduceOp op) override {
    if (!device_) return NativeCollectives::allreduceOnDevice(device, data, count, dtype, op);
    device_->allreduce(device, data, count, dtype, op);
  }
  void reducescatterOnDevice(Device& device, const void* in, void* out, size_t block_count, DataType dtype,
                             ReduceOp op) override {
    if (!device_) return NativeCollectives::reducescatterOnDevice(device, in, out, block_count, dtype, op);
    device_->reducescatter(device, in, out, block_count, dtype, op);
  }
  bool movesOnDevice(Device& device) override { return device_ && device_->moves(device); }
  void broadcastOnDevice(Device& device, void* data, size_t bytes, int root) override {
    if (!device_) return NativeCollectives::broadcastOnDevice(device, data, bytes, root);
    device_->broadcast(device, data, bytes, root);
  }
  void allgatherOnDevice(Device& device, const void* in, void* out, size_t block_bytes) override {
    if (!device_) return NativeCollectives::allgatherOnDevice(device, in, out, block_bytes);
    device_->allgather(device, in, out, block_bytes);
  }
  void alltoallOnDevice(Device& device, const void* in, void* out, const std::vector<size_t>& send_bytes,
                        const std::vector<size_t>& recv_bytes) override {
    if (!device_) return NativeCollectives::alltoallOnDevice(device, in, out, send_bytes, recv_bytes);
    device_->alltoall(device, in, out, send_bytes, recv_bytes);
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::unique_ptr<C10dDeviceCollectives> device_;
};

}  // namespace hvdtorch
