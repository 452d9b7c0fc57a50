#include "strategies/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "registered_tensor.h"
#include "strategies/engine_ops.h"
#include "torch_tensor.h"

namespace hvdtorch {

// The buffers of one bucket of a layout (reused every pass; a bucket has at most one pass in flight).
// Packed slot by slot: P as n x r, Q as its transpose, r x m (see the header on why).
struct PowerSGDBuffers {
  at::Tensor p, q;            // the parameters' dtype
  at::Tensor p_wire, q_wire;  // what travels: p and q themselves, or copies in the wire dtype
  at::Tensor plain;
};

namespace {

bool compressibleDtype(at::ScalarType t) { return t == at::kFloat || t == at::kDouble; }

// An m x r copy of `q` stored column by column (its transpose contiguous).
at::Tensor columnMajorCopy(const at::Tensor& q) { return q.t().clone(at::MemoryFormat::Contiguous).t(); }

// A buffer one all-reduce reads and writes: registered memory on the host.
at::Tensor wireBuffer(Engine& engine, int64_t numel, at::ScalarType dtype, const at::Device& device) {
  if (device.is_cpu()) return registeredZeros(engine, numel, dtype);
  return at::zeros({numel}, at::TensorOptions().dtype(dtype).device(device));
}

// Gram-Schmidt over the columns of `p` (n x r), in place: each column is
// normalized, then its component is taken out of the columns after it. A
// zero column stays zero (its norm is clamped to the dtype's smallest normal).
void orthogonalize(const at::Tensor& p) {
  const double tiny = p.scalar_type() == at::kDouble ? std::numeric_limits<double>::min()
                                                     : std::numeric_limits<float>::min();
  const int64_t r = p.size(1);
  for (int64_t i = 0; i < r; ++i) {
    at::Tensor col = p.narrow(1, i, 1);
    col.div_(col.norm().clamp_min(tiny));
    if (i + 1 < r) {
      at::Tensor rest = p.narrow(1, i + 1, r - i - 1);
      rest.sub_(col.mul(col.mul(rest).sum(0, /*keepdim=*/true)));
    }
  }
}

// One compressed parameter during a pass: views into the bucket, the packed
// buffers and the parameter's state.
struct Factorized {
  at::Tensor m;       // n x m, the bucket slot: gradient + error, then the result
  at::Tensor p;       // n x r in the packed P buffer
  at::Tensor qt;      // r x m in the packed Q buffer: Q transposed
  at::Tensor error;   // the parameter's state
  at::Tensor q_kept;  // the parameter's state, m x r column-major
};

// A plain slot: copied out into the packed buffer and back.
struct PlainSlot {
  at::Tensor slot;
  at::Tensor packed;
};

class PowerSGDOp : public BucketOp {
 public:
  PowerSGDOp(Engine& engine, ops::AllreduceOptions average, std::string name, at::Tensor flat, double factor,
             std::vector<Factorized> mats, std::vector<PlainSlot> plain, std::shared_ptr<PowerSGDBuffers> bufs,
             std::shared_ptr<OpState> plain_op, std::shared_ptr<OpState> p_op)
      : engine_(engine),
        average_(std::move(average)),
        name_(std::move(name)),
        flat_(std::move(flat)),
        factor_(factor),
        mats_(std::move(mats)),
        plain_(std::move(plain)),
        bufs_(std::move(bufs)),
        plain_op_(std::move(plain_op)),
        p_op_(std::move(p_op)) {}

  at::Tensor finish() override {
    waitForOp(*p_op_);
    if (!bufs_->p_wire.is_same(bufs_->p)) bufs_->p.copy_(bufs_->p_wire);
    for (Factorized& f : mats_) orthogonalize(f.p);
    for (Factorized& f : mats_) at::mm_out(f.qt, f.p.t(), f.m);  // Q^T = P^T M
    if (!bufs_->q_wire.is_same(bufs_->q)) bufs_->q_wire.copy_(bufs_->q);
    q_op_ = allreduceInPlace(engine_, average_, bufs_->q_wire, name_ + ".q");
    waitForOp(*q_op_);
    if (!bufs_->q_wire.is_same(bufs_->q)) bufs_->q.copy_(bufs_->q_wire);
    for (Factorized& f : mats_) {
      f.q_kept.t().copy_(f.qt);  // the next pass's warm start
      // Error feedback, what this pass left out: error = M - P Q^T in one product, no n x m temporary.
      at::addmm_out(f.error, f.m, f.p, f.qt, /*beta=*/1, /*alpha=*/-1);
      // The slot gets P Q^T itself, not M - error: M is this rank's, and its rounding would make the
      // ranks' results differ in the last bits.
      at::mm_out(f.m, f.p, f.qt);
      if (factor_ != 1.0) f.m.mul_(factor_);
    }
    if (plain_op_) {
      waitForOp(*plain_op_);
      for (const PlainSlot& s : plain_) s.slot.copy_(s.packed);
    }
    return flat_;
  }

  void drain(std::chrono::milliseconds timeout) override {
    if (plain_op_) plain_op_->waitFor(timeout);
    p_op_->waitFor(timeout);
    if (q_op_) q_op_->waitFor(timeout);
  }

 private:
  Engine& engine_;
  ops::AllreduceOptions average_;
  std::string name_;
  at::Tensor flat_;
  double factor_;
  std::vector<Factorized> mats_;
  std::vector<PlainSlot> plain_;
  std::shared_ptr<PowerSGDBuffers> bufs_;
  std::shared_ptr<OpState> plain_op_, p_op_, q_op_;
};

}  // namespace

PowerSGDStrategy::PowerSGDStrategy(PowerSGDOptions options) : opts_(options) {
  if (opts_.rank < 1) throw InvalidArgument(strCat("hvdtorch: PowerSGD rank must be >= 1, got ", opts_.rank));
  if (opts_.start_iter < 0)
    throw InvalidArgument(strCat("hvdtorch: PowerSGD start_iter must be >= 0, got ", opts_.start_iter));
  if (opts_.min_compression_rate < 0)
    throw InvalidArgument(
        strCat("hvdtorch: PowerSGD min_compression_rate must be >= 0, got ", opts_.min_compression_rate));
}

std::vector<PowerSGDStrategy::Slot> PowerSGDStrategy::planBucket(const ReducerBucket& bucket) const {
  std::vector<Slot> slots;
  for (size_t i = 0; i < bucket.params.size(); ++i) {
    const std::vector<int64_t>& shape = bucket.shapes[i];
    Slot s;
    s.param = bucket.params[i];
    s.offset = bucket.offsets[i];
    s.numel = 1;
    for (int64_t d : shape) s.numel *= d;
    if (shape.size() >= 2 && s.numel > 0 && compressibleDtype(bucket.param_dtype)) {
      s.n = shape[0];
      s.m = s.numel / s.n;
      s.r = std::min({opts_.rank, s.n, s.m});
      const double full = static_cast<double>(s.n) * static_cast<double>(s.m);
      s.compressed = full >= opts_.min_compression_rate * static_cast<double>(s.r * (s.n + s.m));
    }
    slots.push_back(s);
  }
  return slots;
}

void PowerSGDStrategy::layoutChanged(const std::vector<ReducerBucket>& buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.clear();
  for (const ReducerBucket& b : buckets) plans_.push_back(planBucket(b));
  buffers_.assign(plans_.size(), nullptr);
  launched_ = 0;
}

void PowerSGDStrategy::checkShapes(const Slot& slot, const PowerSGDParamState& st) const {
  if (st.error.dim() != 2 || st.error.size(0) != slot.n || st.error.size(1) != slot.m || st.q.dim() != 2 ||
      st.q.size(0) != slot.m || st.q.size(1) != slot.r)
    throw InvalidArgument(strCat("hvdtorch: PowerSGD state of parameter ", slot.param, " has error ", st.error.sizes(),
                                 " and Q ", st.q.sizes(), "; this model needs [", slot.n, ", ", slot.m, "] and [",
                                 slot.m, ", ", slot.r, "] (rank ", opts_.rank, ")"));
}

PowerSGDParamState& PowerSGDStrategy::stateFor(const Slot& slot, const at::Tensor& like) {
  auto it = state_.find(slot.param);
  if (it == state_.end()) {
    PowerSGDParamState st;
    st.error = at::zeros({slot.n, slot.m}, like.options());
    // The same Q on every rank: a generator of its own, seeded by the parameter's index.
    const at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opts_.seed + static_cast<uint64_t>(slot.param));
    st.q = columnMajorCopy(
        at::randn({slot.m, slot.r}, gen, at::TensorOptions().dtype(like.scalar_type())).to(like.device()));
    return state_.emplace(slot.param, std::move(st)).first->second;
  }
  PowerSGDParamState& st = it->second;
  checkShapes(slot, st);
  const auto differs = [&like](const at::Tensor& t) {
    return t.scalar_type() != like.scalar_type() || t.device() != like.device();
  };
  if (differs(st.error)) st.error = st.error.to(like.options());
  if (differs(st.q)) st.q = columnMajorCopy(st.q.to(like.options()));
  return st;
}

std::unique_ptr<BucketOp> PowerSGDStrategy::launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                                   const std::string& name) {
  const ReduceOp op = ctx.allreduce.op;
  if (op != ReduceOp::kAverage && op != ReduceOp::kSum)
    throw InvalidArgument(strCat("hvdtorch: PowerSGD reduces with Average or Sum, not ", reduceOpName(op)));
  std::lock_guard<std::mutex> lock(mu_);
  if (bucket.index >= plans_.size())
    throw InvalidArgument(
        strCat("hvdtorch: PowerSGD was given bucket ", bucket.index, " of a layout of ", plans_.size(), " buckets"));
  const bool compress = iteration_ >= opts_.start_iter;
  if (++launched_ == plans_.size()) {  // the pass's last bucket
    launched_ = 0;
    ++iteration_;
  }
  const std::vector<Slot>& plan = plans_[bucket.index];
  if (!compress || std::none_of(plan.begin(), plan.end(), [](const Slot& s) { return s.compressed; }))
    return allreduceBucket(ctx, bucket, name);

  Engine& engine = *ctx.engine;
  const at::Tensor& flat = bucket.flat;
  std::shared_ptr<PowerSGDBuffers>& bufs = buffers_[bucket.index];
  if (!bufs) {
    int64_t p_elems = 0, q_elems = 0, plain_elems = 0;
    for (const Slot& s : plan) {
      p_elems += s.compressed ? s.n * s.r : 0;
      q_elems += s.compressed ? s.m * s.r : 0;
      plain_elems += s.compressed ? 0 : s.numel;
    }
    bufs = std::make_shared<PowerSGDBuffers>();
    // The gradient core's codec rule (wire_codec.h) names the wire dtype: float16 for the float32/float64
    // buckets compressed here (compressibleDtype), as Compression.fp16 sends a bucket.
    const at::ScalarType wire = wireScalarType(opts_.fp16 ? WireCodec::kFp16 : WireCodec::kNone, flat.scalar_type());
    const bool converted = wire != flat.scalar_type();
    bufs->p_wire = wireBuffer(engine, p_elems, wire, flat.device());
    bufs->q_wire = wireBuffer(engine, q_elems, wire, flat.device());
    bufs->p = converted ? at::zeros({p_elems}, flat.options()) : bufs->p_wire;
    bufs->q = converted ? at::zeros({q_elems}, flat.options()) : bufs->q_wire;
    if (plain_elems > 0) bufs->plain = wireBuffer(engine, plain_elems, flat.scalar_type(), flat.device());
  }

  std::vector<Factorized> mats;
  std::vector<PlainSlot> plain;
  int64_t p_at = 0, q_at = 0, plain_at = 0;
  for (const Slot& s : plan) {
    const at::Tensor slot = flat.narrow(0, s.offset, s.numel);
    if (!s.compressed) {
      plain.push_back({slot, bufs->plain.narrow(0, plain_at, s.numel)});
      plain.back().packed.copy_(slot);
      plain_at += s.numel;
      continue;
    }
    PowerSGDParamState& st = stateFor(s, flat);
    Factorized f{slot.view({s.n, s.m}), bufs->p.narrow(0, p_at, s.n * s.r).view({s.n, s.r}),
                 bufs->q.narrow(0, q_at, s.m * s.r).view({s.r, s.m}), st.error, st.q};
    p_at += s.n * s.r;
    q_at += s.m * s.r;
    f.m.add_(f.error);               // M = gradient + error
    at::mm_out(f.p, f.m, f.q_kept);  // P = M Q
    mats.push_back(std::move(f));
  }
  if (!bufs->p_wire.is_same(bufs->p)) bufs->p_wire.copy_(bufs->p);

  // The plain slots with the reducer's op and scale factors; P and Q averaged
  // unscaled (P's scale goes with the orthogonalization, Q's is applied at the end).
  std::shared_ptr<OpState> plain_op;
  if (!plain.empty()) plain_op = allreduceInPlace(engine, ctx.allreduce, bufs->plain, name + ".plain");
  ops::AllreduceOptions average = ctx.allreduce;
  average.op = ReduceOp::kAverage;
  average.prescale = 1.0;
  average.postscale = 1.0;
  std::shared_ptr<OpState> p_op = allreduceInPlace(engine, average, bufs->p_wire, name + ".p");
  const double factor = ctx.allreduce.prescale * ctx.allreduce.postscale * (op == ReduceOp::kSum ? ctx.set_size : 1);
  return std::make_unique<PowerSGDOp>(engine, std::move(average), name, flat, factor, std::move(mats), std::move(plain),
                                      bufs, std::move(plain_op), std::move(p_op));
}

int64_t PowerSGDStrategy::iteration() const {
  std::lock_guard<std::mutex> lock(mu_);
  return iteration_;
}

std::map<int64_t, PowerSGDParamState> PowerSGDStrategy::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int64_t, PowerSGDParamState> out;
  for (const auto& [param, st] : state_) out[param] = {st.error.clone(), st.q.clone(at::MemoryFormat::Contiguous)};
  return out;
}

void PowerSGDStrategy::loadState(int64_t iteration, const std::map<int64_t, PowerSGDParamState>& state) {
  if (iteration < 0) throw InvalidArgument(strCat("hvdtorch: PowerSGD iteration must be >= 0, got ", iteration));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& plan : plans_)
    for (const Slot& s : plan) {
      const auto it = state.find(s.param);
      if (s.compressed && it != state.end()) checkShapes(s, it->second);
    }
  state_.clear();
  for (const auto& [param, st] : state) {
    if (!st.error.defined() || !st.q.defined())
      throw InvalidArgument(strCat("hvdtorch: PowerSGD state of parameter ", param, " lacks its error or Q"));
    state_[param] = {st.error.clone(), columnMajorCopy(st.q)};
  }
  iteration_ = iteration;
  launched_ = 0;
}

}  // namespace hvdtorch
