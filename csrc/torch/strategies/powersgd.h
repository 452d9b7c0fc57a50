// PowerSGD (Vogels et al., NeurIPS 2019) as a bucket strategy
// (bucket_strategy.h): each gradient matrix M (n x m: a parameter's first
// dimension by the rest) travels as two low-rank factors P (n x r) and
// Q (m x r) instead of n*m numbers.
//
// Contract, per bucket of a reduced pass:
//  * Passes are counted by launches (every reduced pass launches every
//    bucket once). The first `start_iter` reduced passes all-reduce the
//    whole bucket plainly (the reducer's op and scale factors), and no error
//    accumulates.
//  * After that, a slot is compressed when its parameter is float32/float64,
//    has two or more dimensions and n*m >= min_compression_rate * r*(n+m)
//    with r = min(rank, n, m); the other slots (vectors, small matrices,
//    other dtypes) are packed into one buffer all-reduced with the reducer's
//    op and scale factors, submitted in launch().
//  * launch(): M = gradient + error (error feedback, kept per parameter);
//    P = M Q, Q warm-started from the last pass (the first Q: a CPU
//    generator seeded seed + parameter index, standard normal, so every
//    rank starts from the same Q without communication); the bucket's Ps,
//    packed in one buffer, are all-reduced (Average) while backward goes on.
//  * finish(): waits; orthogonalizes each P (Gram-Schmidt over its columns;
//    a zero column stays zero); Q = M^T P, all-reduced (Average) in one
//    buffer per bucket; M_hat = P Q^T (the average of the ranks' M,
//    approximated); error = M - M_hat; the slot gets M_hat times the scale
//    factors, times the set's size under Sum (bit for bit the same on every
//    rank: it is computed from the all-reduced P and Q alone). Q is kept for
//    the next pass.
//  * Layouts, for speed: no product reads M transposed. Q travels as Q^T
//    (r x m, computed as P^T M) and is kept column-major, so P = M Q reads
//    it as a transposed operand. On the CPU (one MKL thread) M^T P took 10x
//    as long as P^T M for a 2048 x 4096 M at rank 4 (49 ms against 5 ms).
//  * fp16: P and Q travel in the fp16 codec's wire dtype (wire_codec.h;
//    float16 for the float32/float64 buckets compressed), computed in the
//    parameters' dtype; the uncompressed slots travel in their own dtype.
//  * Only Average and Sum (InvalidArgument otherwise).
//  * State (the pass count, each compressed parameter's error and Q) is
//    keyed by the parameter's index in the reducer's list, so a new bucket
//    layout keeps it. state()/loadState() are called between passes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "strategies/bucket_strategy.h"

namespace hvdtorch {

struct PowerSGDBuffers;

struct PowerSGDOptions {
  int64_t rank = 1;                   // columns of P and Q (at most min(n, m) per matrix)
  int64_t start_iter = 10;            // reduced passes all-reduced plainly before compression
  double min_compression_rate = 2.0;  // compress only where n*m >= rate * r*(n+m)
  bool fp16 = false;                  // P and Q travel in the fp16 codec's wire dtype
  uint64_t seed = 0;                  // the first Q of parameter i: a generator seeded seed + i
};

// What a compressed parameter carries from one pass to the next.
struct PowerSGDParamState {
  at::Tensor error;  // n x m: what the last compressed pass left out of this rank's M
  at::Tensor q;      // m x r: the last all-reduced Q (warm start); kept column-major, handed out row-major
};

class PowerSGDStrategy : public BucketStrategy {
 public:
  // InvalidArgument for rank < 1, start_iter < 0 or a negative rate.
  explicit PowerSGDStrategy(PowerSGDOptions options);

  const char* name() const override { return "powersgd"; }
  bool keepsGradients() const override { return true; }
  bool registeredBuckets() const override { return true; }
  bool zerosReduceToZeros() const override { return false; }  // each rank's error is added
  void layoutChanged(const std::vector<ReducerBucket>& buckets) override;
  std::unique_ptr<BucketOp> launch(const StrategyContext& ctx, const ReducerBucket& bucket,
                                   const std::string& name) override;

  const PowerSGDOptions& options() const { return opts_; }
  // Reduced passes counted so far.
  int64_t iteration() const;
  // Copies of every compressed parameter's state, by parameter index.
  std::map<int64_t, PowerSGDParamState> state() const;
  // Replaces the pass count and the state (copied). A parameter whose error
  // or Q has the wrong shape for the current layout is InvalidArgument.
  void loadState(int64_t iteration, const std::map<int64_t, PowerSGDParamState>& state);

  // One slot of a bucket, as the strategy plans it.
  struct Slot {
    int64_t param = 0;   // index in the reducer's parameter list
    int64_t offset = 0;  // element offset in the bucket
    int64_t numel = 0;
    int64_t n = 0, m = 0, r = 0;  // compressed: M is n x m, P n x r, Q m x r
    bool compressed = false;
  };

 private:
  std::vector<Slot> planBucket(const ReducerBucket& bucket) const;
  // The parameter's state for a compressed slot: made on first use (zero
  // error, the seeded Q), moved to `like`'s dtype and device, shape checked.
  PowerSGDParamState& stateFor(const Slot& slot, const at::Tensor& like);
  void checkShapes(const Slot& slot, const PowerSGDParamState& st) const;

  PowerSGDOptions opts_;
  mutable std::mutex mu_;
  std::vector<std::vector<Slot>> plans_;                   // per bucket index
  std::vector<std::shared_ptr<PowerSGDBuffers>> buffers_;  // per bucket index, made on its first compressed pass
  int64_t iteration_ = 0;
  size_t launched_ = 0;  // buckets launched in the current pass
  std::map<int64_t, PowerSGDParamState> state_;
};

}  // namespace hvdtorch
