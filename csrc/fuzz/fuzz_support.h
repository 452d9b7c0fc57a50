// Shared by the libFuzzer target and the seed-corpus writer: the input
// format, and a Link that plays back bytes as if a peer had sent them.
//
// Input: byte 0 selects what decodes the rest (Target below); the rest is the
// message, or for the framed targets what the peer's link delivers (the
// 4096-byte frame with its length prefix, then the continuation).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "ops/op_table.h"
#include "transport/link.h"

namespace hvdtorch::fuzz {

// The decoders read the op table in use (engine/op_spec.h), which an Engine
// would otherwise install: ops' table, from the start.
[[maybe_unused]] inline const bool kOpTableInUse = (useOpTable(ops::opTable()), true);

enum Target : uint8_t {
  kRankMessage = 0,    // RankMessage::parse
  kResponseList = 1,   // ResponseList::parse
  kRequest = 2,        // Request::read of one request
  kReplyToRank = 3,    // a non-root rank receiving rank 0's reply (framing + ResponseList::parse)
  kCoordinatorIn = 4,  // rank 0 receiving a rank's message (framing + parse + Coordinator::process)
  kTargets = 5,
};

// Receives from `data` in order; sends go nowhere. Running out of data is
// the peer closing the connection (CollectiveError), as on a real link.
class ScriptedLink : public Link {
 public:
  ScriptedLink(int peer, const uint8_t* data, size_t size) : peer_(peer), p_(data), end_(data + size) {}
  int peer() const override { return peer_; }
  const char* kind() const override { return "scripted"; }
  std::unique_ptr<LinkRequest> isend(const void*, size_t) override { return std::make_unique<Done>(); }
  std::unique_ptr<LinkRequest> irecv(void* out, size_t bytes) override {
    if (static_cast<size_t>(end_ - p_) < bytes)
      throw CollectiveError(strCat("receive from rank ", peer_, " failed: connection closed"));
    std::memcpy(out, p_, bytes);
    p_ += bytes;
    return std::make_unique<Done>();
  }

 private:
  struct Done : LinkRequest {
    void wait(Deadline) override {}
  };
  int peer_;
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace hvdtorch::fuzz
