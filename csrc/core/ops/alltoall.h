// Alltoall: rank r sends rows [sum(splits[:d]), sum(splits[:d+1])) of
// dimension 0 to rank d and receives, in rank order, what every rank sends
// it. The receive sizes come from negotiation (every rank's splits travel in
// the response), so the output is made only after it.
#pragma once

#include <string>
#include <tuple>
#include <vector>

#include "engine/engine.h"
#include "ops/option_fields.h"

namespace hvdtorch::ops {

struct AlltoallOptions {
  static constexpr OpType kType = OpType::kAlltoall;
  std::string name;
  TensorPtr input;  // at least one dimension
  // Rows sent to each rank, in rank order; empty: dimension 0 divided evenly
  // (it must then be a multiple of the number of ranks).
  std::vector<int64_t> splits;
  // Makes the output. The op's outputs are {output, received splits}, the
  // latter a HostTensor of int64, the rows received from each rank.
  OutputAllocator allocate;
  int32_t process_set_id = 0;
  // Its plain fields, which the Python binding sets by name (ops/option_fields.h).
  static constexpr auto fields() {
    return std::make_tuple(field("name", &AlltoallOptions::name), field("splits", &AlltoallOptions::splits),
                           field("process_set_id", &AlltoallOptions::process_set_id));
  }
};

int64_t alltoall(Engine& engine, AlltoallOptions opts);

// Its row's make_plan (engine/op_spec.h).
OpPlan planAlltoall(const std::vector<const Request*>& by_rank);
// Its row's execute (engine/op_spec.h).
void executeAlltoall(Executor& ex, WorkUnit& unit);

}  // namespace hvdtorch::ops
