#include "ops/alltoall.h"

#include <numeric>

#include "common/error.h"
#include "ops/op_common.h"

namespace hvdtorch::ops {

namespace {

std::string listStr(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += strCat(i ? ", " : "", v[i]);
  return s + "]";
}

}  // namespace

int64_t alltoall(Engine& engine, AlltoallOptions opts) {
  const OpWhere where{engine, OpType::kAlltoall, opts.name};
  const auto ps = checkProcessSet(where, opts.process_set_id);
  if (!opts.allocate) throw InvalidArgument(strCat(where.str(), ": needs an output allocator"));
  const std::vector<int64_t> shape = opts.input->shape();
  if (shape.empty()) throw InvalidArgument(strCat(where.str(), ": the tensor needs at least one dimension"));
  const int size = static_cast<int>(ps->ranks.size());
  const int64_t dim0 = shape[0];
  if (opts.splits.empty()) {
    if (dim0 % size != 0)
      throw InvalidArgument(strCat(where.str(), ": splits not given, and the first dimension ", dim0,
                                   " is not a multiple of the number of ranks ", size));
    opts.splits.assign(size, dim0 / size);
  }
  if (static_cast<int>(opts.splits.size()) != size)
    throw InvalidArgument(strCat(where.str(), ": splits ", listStr(opts.splits), " has ", opts.splits.size(),
                                 " entries; it needs one per rank (", size, ")"));
  for (int64_t s : opts.splits)
    if (s < 0) throw InvalidArgument(strCat(where.str(), ": splits ", listStr(opts.splits), " has a negative entry"));
  const int64_t sum = std::accumulate(opts.splits.begin(), opts.splits.end(), int64_t(0));
  if (sum != dim0)
    throw InvalidArgument(
        strCat(where.str(), ": splits ", listStr(opts.splits), " sum to ", sum, ", not to the first dimension ", dim0));
  auto e = std::make_shared<Entry>();
  Request& q = e->request;
  q.type = OpType::kAlltoall;
  q.process_set_id = opts.process_set_id;
  q.tensors.push_back(specOf(*opts.input));
  q.args = AlltoallArgs{std::move(opts.splits)};
  q.name = std::move(opts.name);
  e->inputs = {std::move(opts.input)};
  e->allocate = std::move(opts.allocate);
  return engine.submit(std::move(e));
}

}  // namespace hvdtorch::ops
