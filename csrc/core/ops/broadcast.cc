#include "ops/broadcast.h"

#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

int64_t broadcast(Engine& engine, BroadcastOptions opts) {
  const OpWhere where{engine, OpType::kBroadcast, opts.name};
  checkProcessSet(where, opts.process_set_id);
  const int size = engine.topo().size;
  if (opts.root < 0 || opts.root >= size)
    throw InvalidArgument(strCat(where.str(), ": root_rank ", opts.root, " is not a rank in [0, ", size, ")"));
  if (opts.input->numel() != opts.output->numel() || opts.input->dtype() != opts.output->dtype())
    throw InvalidArgument(strCat(where.str(), ": output does not match the input"));
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kBroadcast;
  q.process_set_id = opts.process_set_id;
  q.tensors.push_back(specOf(*opts.input));
  q.args = BroadcastArgs{opts.root};
  q.name = std::move(opts.name);
  e->inputs = {std::move(opts.input)};
  e->outputs = {std::move(opts.output)};
  return engine.submit(std::move(e));
}

}  // namespace hvdtorch::ops
