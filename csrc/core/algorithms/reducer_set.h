// Owns one instance of every reducer (each keeps persistent scratch memory)
// and resolves a requested kind, `auto` included, to the one that runs.
//
// The `auto` rule is an alpha-beta cost model: for each candidate reducer the
// time of an n-byte all-reduce is estimated as alpha + beta·n, and the
// cheapest candidate wins. calibrate() measures every candidate at two sizes
// on the real transports at init and fits alpha and beta; the times are
// max-reduced over ranks first, so every rank holds the same model and makes
// the same choice (they must: all ranks run the same reducer). Without
// calibration, conservative defaults apply. The backend's native all-reduce
// is a candidate only for dtypes/ops it supports.
#pragma once

#include <array>
#include <memory>

#include "algorithms/central_allreduce.h"
#include "algorithms/native_allreduce.h"
#include "algorithms/reducer.h"
#include "algorithms/ring_allreduce.h"

namespace hvdtorch {

struct CostModel {
  // Seconds and seconds per byte, per ReducerKind (index = kind); a negative
  // alpha marks a reducer that is not available.
  std::array<double, 5> alpha{};
  std::array<double, 5> beta{};
  double estimate(ReducerKind k, size_t bytes) const {
    return alpha[static_cast<int>(k)] + beta[static_cast<int>(k)] * static_cast<double>(bytes);
  }
  bool available(ReducerKind k) const { return alpha[static_cast<int>(k)] >= 0; }
};

class ReducerSet {
 public:
  ReducerSet(RingOptions ring, CentralOptions central);

  // Installs the node reducer (needs shared memory; absent when HVDTORCH_SHM=0).
  void setNode(std::unique_ptr<Reducer> node);
  bool hasNode() const { return static_cast<bool>(node_); }

  Reducer& get(ReducerKind kind);
  // The reducer `auto` chooses for `bytes` of `dtype`/`op` on this context.
  ReducerKind choose(const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) const;
  Reducer& resolve(ReducerKind kind, const Context& ctx, size_t bytes, DataType dtype, ReduceOp op) {
    return get(kind == ReducerKind::kAuto ? choose(ctx, bytes, dtype, op) : kind);
  }

  // Collective: every rank must call it at the same point.
  void calibrate(Context& ctx);
  CostModel& model() { return model_; }
  const CostModel& model() const { return model_; }

 private:
  RingAllreduce ring_;
  CentralAllreduce central_;
  NativeAllreduce native_;
  std::unique_ptr<Reducer> node_;
  CostModel model_;
};

}  // namespace hvdtorch
