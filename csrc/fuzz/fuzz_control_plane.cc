// libFuzzer target: everything that decodes bytes arriving on the control
// plane. A malformed, truncated or oversized input must end in
// CollectiveError or InvalidArgument; anything else (a crash, another
// exception, an allocation past libFuzzer's -malloc_limit_mb, a sanitizer
// report) is a finding. Inputs that decode must survive a round trip:
// serialize(parse(x)) parses again to the same bytes.
//
//   build/fuzz/fuzz_control_plane -max_total_time=30 build/fuzz/corpus csrc/fuzz/corpus
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/negotiation/control_plane.h"
#include "engine/negotiation/coordinator.h"
#include "engine/negotiation/response_cache.h"
#include "engine/request.h"
#include "fuzz_support.h"
#include "transport/context.h"

using namespace hvdtorch;
using namespace hvdtorch::fuzz;

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_control_plane: %s\n", what);
    std::abort();
  }
}

template <typename Message>
void roundTrip(const std::vector<char>& bytes) {
  const std::vector<char> once = Message::parse(bytes).serialize();
  require(Message::parse(once).serialize() == once, "a decoded message does not survive a round trip");
}

// Two ranks on two hosts: every hop is a "remote" link, played back from the input.
Context contextOf(int rank, const uint8_t* data, size_t size) {
  const int peer = 1 - rank;
  return Context(
      Topology::build(rank, {0, 1}),
      [=](int p) -> std::unique_ptr<Link> {
        require(p == peer, "link to an unexpected peer");
        return std::make_unique<ScriptedLink>(p, data, size);
      },
      nullptr, nullptr, std::chrono::milliseconds(1000));
}

Request cachedRequest(const char* name, OpType type) {
  Request q;
  q.type = type;
  q.name = name;
  q.tensors = {{DataType::kFloat32, {4, 2}}};
  if (type == OpType::kAllreduce) q.args = ReduceArgs{};
  if (type == OpType::kBroadcast) q.args = BroadcastArgs{1};
  return q;
}

void run(Target target, const uint8_t* data, size_t size) {
  const std::vector<char> bytes(data, data + size);
  switch (target) {
    case kRankMessage: roundTrip<RankMessage>(bytes); break;
    case kResponseList: roundTrip<ResponseList>(bytes); break;
    case kRequest: {
      ByteReader r(bytes.data(), bytes.size());
      const Request q = Request::read(r);
      r.expectEnd();
      ByteWriter w;
      q.write(w);
      ByteReader again(w.bytes().data(), w.bytes().size());
      ByteWriter w2;
      Request::read(again).write(w2);
      require(w2.bytes() == w.bytes(), "a decoded request does not survive a round trip");
      (void)q.describe();
      break;
    }
    case kReplyToRank: {
      Context ctx = contextOf(1, data, size);
      ControlPlane plane(ctx);
      RankMessage mine;
      const std::vector<char> reply = plane.exchange(mine.serialize(), nullptr);
      roundTrip<ResponseList>(reply);
      break;
    }
    case kCoordinatorIn: {
      Context ctx = contextOf(0, data, size);
      ControlPlane plane(ctx);
      ResponseCache cache(4);
      cache.put(cachedRequest("cached.a", OpType::kAllreduce));
      cache.put(cachedRequest("cached.b", OpType::kBroadcast));
      Coordinator coordinator(2, std::chrono::milliseconds(1), std::chrono::milliseconds(2), [](const std::string&) {});
      RankMessage mine;
      mine.uncached.push_back(cachedRequest("x", OpType::kAllreduce));
      mine.cache_bits = {1};
      const std::vector<char> reply = plane.exchange(mine.serialize(), [&](std::vector<std::vector<char>>& all) {
        std::vector<RankMessage> msgs;
        for (const auto& b : all) msgs.push_back(RankMessage::parse(b));
        return coordinator.process(msgs, cache, Coordinator::Clock::now()).serialize();
      });
      roundTrip<ResponseList>(reply);
      break;
    }
    default: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  try {
    run(static_cast<Target>(data[0] % kTargets), data + 1, size - 1);
  } catch (const CollectiveError&) {
  } catch (const InvalidArgument&) {
  }
  return 0;
}
