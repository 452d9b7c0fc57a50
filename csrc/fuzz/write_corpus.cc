// Writes the seed corpus of fuzz_control_plane: well-formed messages of every
// kind, so that fuzzing starts from inputs that decode and mutates from there.
//
//   build/fuzz/write_fuzz_corpus csrc/fuzz/corpus
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/request.h"
#include "fuzz_support.h"

using namespace hvdtorch;
using namespace hvdtorch::fuzz;

namespace {

std::vector<Request> everyKindOfRequest() {
  std::vector<Request> out;
  Request a;
  a.type = OpType::kAllreduce;
  a.name = "grad.layer1";
  a.tensors = {{DataType::kFloat32, {4, 5}}, {DataType::kFloat32, {3}}};
  a.args = ReduceArgs{ReduceOp::kAverage, 0.5, 2.0, kAutoReducer, true};
  out.push_back(a);
  Request g;
  g.type = OpType::kAllgather;
  g.name = "gather";
  g.process_set_id = 1;
  g.tensors = {{DataType::kInt64, {0, 3}}};
  out.push_back(g);
  Request b;
  b.type = OpType::kBroadcast;
  b.name = "bcast";
  b.tensors = {{DataType::kBFloat16, {}}};
  b.args = BroadcastArgs{1};
  out.push_back(b);
  Request t;
  t.type = OpType::kAlltoall;
  t.name = "a2a";
  t.tensors = {{DataType::kUInt8, {3, 2}}};
  t.args = AlltoallArgs{{1, 2}};
  out.push_back(t);
  Request s;
  s.type = OpType::kReducescatter;
  s.name = "rs";
  s.tensors = {{DataType::kFloat16, {5}}};
  s.args = ReduceArgs{ReduceOp::kMax, 1.0, 1.0, kAutoReducer, true};
  out.push_back(s);
  Request x;
  x.type = OpType::kBarrier;
  x.name = "barrier.noname.0";
  out.push_back(x);
  return out;
}

// The bytes a link delivers for one control-plane message: a 4096-byte frame
// (length, then the first bytes), then the rest.
std::vector<char> framed(const std::vector<char>& msg) {
  std::vector<char> out(4096, 0);
  const uint64_t n = msg.size();
  std::memcpy(out.data(), &n, sizeof n);
  const size_t first = std::min<size_t>(msg.size(), 4096 - sizeof n);
  std::memcpy(out.data() + sizeof n, msg.data(), first);
  out.insert(out.end(), msg.begin() + first, msg.end());
  return out;
}

void write(const std::string& dir, const std::string& name, Target target, const std::vector<char>& body) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  const uint8_t t = target;
  std::fwrite(&t, 1, 1, f);
  std::fwrite(body.data(), 1, body.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto requests = everyKindOfRequest();

  RankMessage m;
  m.failure = "rank 1: peer rank 2 died";
  m.cache_bits = {0x5, 0x8000000000000000ull};
  m.uncached = requests;
  m.busy_sets = {1, 3};
  RankMessage idle;  // steady state: bits only
  idle.cache_bits = {0x3};

  ResponseList l;
  for (const auto& q : requests) {
    Response s;
    s.type = q.type;
    s.name = q.name;
    s.process_set_id = q.process_set_id;
    if (q.type == OpType::kAllgather) s.plan = AllgatherPlan{{0, 2}};
    if (q.type == OpType::kAlltoall) s.plan = AlltoallPlan{{1, 2, 0, 3}};
    if (q.type == OpType::kReducescatter) s.plan = ReducescatterPlan{{3, 2}};
    l.responses.push_back(s);
  }
  Response failed;
  failed.type = OpType::kAllreduce;
  failed.name = "bad";
  failed.error = "mismatched allreduce 'bad' across ranks: shape [3] vs [4]";
  l.responses.push_back(failed);
  l.cached_ready = {0, 7};
  l.busy_sets = {2};
  ResponseList stop;
  stop.shutdown = true;
  stop.shutdown_rank = 1;
  stop.shutdown_reason = "rank 1: lost contact";

  write(dir, "rank-message", kRankMessage, m.serialize());
  write(dir, "rank-message-idle", kRankMessage, idle.serialize());
  write(dir, "response-list", kResponseList, l.serialize());
  write(dir, "response-list-shutdown", kResponseList, stop.serialize());
  for (size_t i = 0; i < requests.size(); ++i) {
    ByteWriter w;
    requests[i].write(w);
    write(dir, "request-" + std::string(opTypeName(requests[i].type)), kRequest, w.bytes());
  }
  write(dir, "reply-framed", kReplyToRank, framed(l.serialize()));
  // Longer than one frame: the continuation path.
  ResponseList big = l;
  big.shutdown_reason = std::string(6000, 'x');
  write(dir, "reply-framed-long", kReplyToRank, framed(big.serialize()));
  write(dir, "coordinator-in", kCoordinatorIn, framed(m.serialize()));
  write(dir, "coordinator-in-idle", kCoordinatorIn, framed(idle.serialize()));
  return 0;
}
