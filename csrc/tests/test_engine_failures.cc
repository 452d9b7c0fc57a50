// The engine when its data plane breaks under a collective: the op fails
// naming itself and the rank, and from then on every submit on every rank is
// refused with that original reason (not a bare "shut down"), so a training
// loop sees the cause however many calls later it looks.
#include <string>
#include <thread>

#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "ops/allreduce.h"

using namespace hvdtorch;
using hvdtorch::test::Cluster;

namespace {

int64_t allreduce(Engine& eng, const std::string& name, int64_t n) {
  ops::AllreduceOptions o;
  o.name = name;
  o.op = ReduceOp::kSum;
  o.reducer = "ring";
  auto t = std::make_shared<HostTensor>(DataType::kFloat32, std::vector<int64_t>{n});
  for (int64_t i = 0; i < n; ++i) static_cast<float*>(t->data())[i] = 1.f;
  o.inputs = {t};
  o.outputs = {t};
  return ops::allreduce(eng, std::move(o));
}

bool waitDone(Engine& eng, int64_t h) { return eng.state(h)->waitFor(std::chrono::milliseconds(10000)); }

// A data link whose every transfer fails, as one to a dead peer would.
class BrokenLink : public Link {
 public:
  BrokenLink(int self, int peer) : self_(self), peer_(peer) {}
  int peer() const override { return peer_; }
  const char* kind() const override { return "broken"; }
  std::unique_ptr<LinkRequest> isend(const void*, size_t) override { return std::make_unique<Failed>(why()); }
  std::unique_ptr<LinkRequest> irecv(void*, size_t) override { return std::make_unique<Failed>(why()); }

 private:
  struct Failed : LinkRequest {
    explicit Failed(std::string w) : what(std::move(w)) {}
    void wait(Deadline) override { throw CollectiveError(what); }
    std::string what;
  };
  std::string why() const { return strCat("rank ", self_, ": link to rank ", peer_, " is broken"); }
  int self_, peer_;
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(broken_data_plane_fails_the_op_and_every_later_submit_with_the_reason) {
  const int p = 3;
  // Every data link fails; negotiation still works. (Calibration would run
  // over the broken links.)
  Config cfg;
  cfg.calibrate = false;
  Cluster c(p, cfg, [](int self, int peer) { return std::make_unique<BrokenLink>(self, peer); });
  std::vector<std::string> first(p), later(p);
  c.onEveryRank([&](int r, Engine& eng) {
    const int64_t h = allreduce(eng, "doomed", 1000);
    CHECK(waitDone(eng, h));
    first[r] = eng.state(h)->error();
    // The failure is recorded right after the op fails: give it a moment.
    for (int i = 0; i < 200 && later[r].empty(); ++i) {
      try {
        allreduce(eng, "after" + std::to_string(i), 4);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } catch (const CollectiveError& err) {
        later[r] = err.what();
      } catch (const InvalidArgument&) {
      }
    }
  });
  for (int r = 0; r < p; ++r) {
    // Either this rank's own executor failed, or a peer's failure reached it first.
    CHECK_MSG(contains(first[r], "allreduce 'doomed' failed"), "rank %d: '%s'", r, first[r].c_str());
    CHECK_MSG(contains(later[r], "allreduce 'doomed' failed"), "rank %d: a later submit said '%s'", r,
              later[r].c_str());
  }
  // A rank's own failure names the rank.
  CHECK_MSG(contains(first[0], "rank 0: allreduce 'doomed' failed") || contains(first[0], "stopped because rank"), "%s",
            first[0].c_str());
}

HVD_TEST_MAIN()
