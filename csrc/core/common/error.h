// Error types that cross the core boundary. The torch layer translates them:
// InvalidArgument -> ValueError, everything else -> RuntimeError
// (hvdtorch.HvdError on the Python side).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace hvdtorch {

// A collective failed (peer died, deadline passed, mismatch across ranks).
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A deadline passed while waiting on a peer.
class TimeoutError : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// A link's connection closed (or broke) and the transport cannot tell why:
// the peer died, or it closed its links on purpose after learning of a
// failure elsewhere. In the second case the peer says why over the control
// plane, so the engine waits a short while for that reason before it blames
// the peer (reasonGrace(), engine/engine_state.h).
class PeerClosed : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// The caller passed something the library cannot serve (bad dtype for the
// op, duplicate name, ...). Raised locally, before anything is sent.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Builds a message from stream-able parts: strCat("rank ", r, ": ", what).
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace hvdtorch
