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
  WorkRequest(c10::intrusive_ptr<c10d::Work> work, at::Tensor keep, int peer, const char* what,
              std::shared_ptr<DeadlineWatch> watch, std::weak_ptr<C10dLink::Aborted> aborted)
      : work_(std::move(work)),
        keep_(std::move(keep)),
        peer_(peer),
        what_(what),
        watch_(std::move(watch)),
        aborted_(std::move(aborted)) {}
  void wait(Deadline deadline) override {
    if (!work_) return;
    const auto start = Deadline::Clock::now();
    bool done = true;
    try {
      if (watch_)
        done = watch_->wait(work_, deadline);
      else
        work_->wait(std::max(deadline.remaining(), std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      work_.reset();
      const std::string why = strCat(what_, " rank ", peer_, " failed: ", e.what());
      if (deadline.expired()) throw TimeoutError(why);
      // Gloo says "connection closed" alike for a peer that died and one
      // that closed its links on purpose (link.h).
      throw PeerClosed(why);
    }
    if (!done) {
      // Still posted in Gloo: its message may yet come, into this work's buffer.
      if (auto kept = aborted_.lock()) {
        std::lock_guard<std::mutex> lock(kept->mu);
        kept->works.push_back(std::move(work_));
      }
      work_.reset();
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Deadline::Clock::now() - start);
      throw TimeoutError(strCat(what_, " rank ", peer_, " timed out after ", waited.count(), " ms"));
    }
    work_.reset();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor keep_;
  int peer_;
  const char* what_;
  std::shared_ptr<DeadlineWatch> watch_;
  std::weak_ptr<C10dLink::Aborted> aborted_;
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

C10dLink::C10dLink(c10::intrusive_ptr<c10d::ProcessGroup> pg, int peer, int channel,
                   std::shared_ptr<DeadlineWatch> watch)
    : pg_(std::move(pg)), peer_(peer), channel_(channel), watch_(std::move(watch)) {
  if (channel < 0 || channel >= kChannels)
    throw InvalidArgument(strCat("c10d link to rank ", peer, ": channel ", channel, " is not in [0, ", kChannels, ")"));
}

std::unique_ptr<LinkRequest> C10dLink::isend(const void* data, size_t bytes) {
  const int tag = tagOf(send_seq_++);
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{bytesView(data, bytes)};
  try {
    return request(pg_->send(t, peer_, tag), t[0], "send to");
  } catch (const std::exception& e) {
    throw PeerClosed(strCat("send to rank ", peer_, " failed: ", e.what()));
  }
}

std::unique_ptr<LinkRequest> C10dLink::irecv(void* data, size_t bytes) {
  const int tag = tagOf(recv_seq_++);
  if (bytes == 0) return std::make_unique<DoneRequest>();
  std::vector<at::Tensor> t{bytesView(data, bytes)};
  try {
    return request(pg_->recv(t, peer_, tag), t[0], "receive from");
  } catch (const std::exception& e) {
    throw PeerClosed(strCat("receive from rank ", peer_, " failed: ", e.what()));
  }
}

std::unique_ptr<LinkRequest> C10dLink::request(c10::intrusive_ptr<c10d::Work> work, at::Tensor keep, const char* what) {
  return std::make_unique<WorkRequest>(std::move(work), std::move(keep), peer_, what, watch_, aborted_);
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
