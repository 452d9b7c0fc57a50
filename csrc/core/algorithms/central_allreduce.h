// Central parameter-server all-reduce: the buffer is cut into `shards` parts;
// the server of part i (rank i*p/shards) receives that part from every other
// rank, reduces it, and sends the result back. With one shard this is the
// classic parameter server: about 2(p-1)·n bytes cross the server's link, so
// it only wins for tiny world sizes. Segmented so the server's scratch memory
// stays bounded and reduction overlaps arrival.
#pragma once

#include <vector>

#include "algorithms/reducer.h"

namespace hvdtorch {

struct CentralOptions {
  int shards = 1;
  size_t segment_bytes = 1 << 20;
};

class CentralAllreduce : public Reducer {
 public:
  explicit CentralAllreduce(CentralOptions opts = {}) : opts_(opts) {}
  const char* name() const override { return "central"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;
  // Per shard, n/shards to its server and back from every other rank, a
  // segment at a time.
  LinkTraffic linkTraffic(const Context& ctx) const override;
  std::map<std::string, int64_t> settings() const override {
    return {{"shards", opts_.shards}, {"segment_bytes", static_cast<int64_t>(opts_.segment_bytes)}};
  }

 private:
  CentralOptions opts_;
  std::vector<char> scratch_;
};

}  // namespace hvdtorch
