#include "c10d_link.h"

#include <ATen/ops/from_blob.h>

#include "common/error.h"
#include "torch_tensor.h"

namespace hvdtorch {

namespace {

at::Tensor bytesView(const void* data, size_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
}

class DoneRequest : public LinkRequest {
 public:
  void wait(Deadline) override {}
};

class WorkRequest : public LinkRequest {
 public:
  WorkRequest(c10::intrusive_ptr<c10d::Work> work, at::Tensor keep, int peer, const char* what)
      : work_(std::move(work)), keep_(std::move(keep)), peer_(peer), what_(what) {}
  void wait(Deadline deadline) override {
    if (!work_) return;
    try {
      work_->wait(std::max(deadline.remaining(), std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      work_.reset();
      const std::string why = strCat(what_, " rank ", peer_, " failed: ", e.what());
      if (deadline.expired()) throw TimeoutError(why);
      // Gloo says "connection closed" alike for a peer that died and one
      // that closed its links on purpose (link.h).
      throw PeerClosed(why);
    }
    work_.reset();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor keep_;
  int peer_;
  const char* what_;
};

void waitOrThrow(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    throw CollectiveError(strCat("native ", what, " failed: ", e.what()));
  }
}

}  // namespace

c10d::ReduceOp toC10dOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
    default: break;
  }
  throw InvalidArgument(strCat("reduce op ", reduceOpName(op), " has no c10d equivalent"));
}

C10dLink::C10dLink(c10::intrusive_ptr<c10d::ProcessGroup> pg, int peer, int channel)
    : pg_(std::move(pg)), peer_(peer), channel_(channel) {
  if (channel < 0 || channel >= kChannels)
    throw InvalidArgument(strCat("c10d link to rank ", peer, ": channel ", channel, " is not in [0, ", kChannels, ")"));
}

std::unique_ptr<LinkRequest> C10dLink::isend(const void* data, size_t bytes) {
  const int tag = tagOf(send_seq_++);
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{bytesView(data, bytes)};
  try {
    return std::make_unique<WorkRequest>(pg_->send(t, peer_, tag), t[0], peer_, "send to");
  } catch (const std::exception& e) {
    throw PeerClosed(strCat("send to rank ", peer_, " failed: ", e.what()));
  }
}

std::unique_ptr<LinkRequest> C10dLink::irecv(void* data, size_t bytes) {
  const int tag = tagOf(recv_seq_++);
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{bytesView(data, bytes)};
  try {
    return std::make_unique<WorkRequest>(pg_->recv(t, peer_, tag), t[0], peer_, "receive from");
  } catch (const std::exception& e) {
    throw PeerClosed(strCat("receive from rank ", peer_, " failed: ", e.what()));
  }
}

bool C10dNative::supports(DataType dtype, ReduceOp op) const {
  // Gloo reduces neither int16 nor (with well-defined semantics) bool.
  if (dtype == DataType::kInt16 || dtype == DataType::kBool) return false;
  return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax || op == ReduceOp::kProduct;
}

void C10dNative::allreduce(void* data, size_t count, DataType dtype, ReduceOp op) {
  std::vector<at::Tensor> t{
      at::from_blob(data, {static_cast<int64_t>(count)}, at::TensorOptions().dtype(toScalarType(dtype)))};
  c10d::AllreduceOptions opts;
  opts.reduceOp = toC10dOp(op);
  waitOrThrow(pg_->allreduce(t, opts), "allreduce");
}

void C10dNative::broadcast(void* data, size_t bytes, int root) {
  if (bytes == 0) return;
  std::vector<at::Tensor> t{bytesView(data, bytes)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  waitOrThrow(pg_->broadcast(t, opts), "broadcast");
}

void C10dNative::barrier() { waitOrThrow(pg_->barrier(), "barrier"); }

}  // namespace hvdtorch
