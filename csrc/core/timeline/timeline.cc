#include "timeline/timeline.h"

#include "common/error.h"

namespace hvdtorch {

namespace {

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

// Trace process of the CYCLE_START marks; op processes count from 1.
constexpr int kCyclePid = 0;

}  // namespace

Timeline::Timeline(const std::string& path, int rank) {
  if (!path.empty()) start(path, rank, false);
}

Timeline::~Timeline() { stop(); }

void Timeline::start(const std::string& path, int rank, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(mu_);
  closeLocked();
  std::string file = path;
  const auto at = file.find("{rank}");
  if (at != std::string::npos) {
    file.replace(at, 6, std::to_string(rank));
  } else if (rank != 0) {
    return;
  }
  out_.open(file, std::ios::out | std::ios::trunc);
  if (!out_) {
    out_.clear();
    throw InvalidArgument(strCat("cannot write the timeline file '", file, "'"));
  }
  out_ << "[\n";
  first_ = true;
  pids_.clear();
  start_ = std::chrono::steady_clock::now();
  mark_cycles_ = mark_cycles;
  if (mark_cycles_) {
    out_ << R"({"name": "process_name", "ph": "M", "pid": )" << kCyclePid
         << R"(, "args": {"name": "negotiation cycles"}})";
    first_ = false;
  }
  enabled_.store(true, std::memory_order_relaxed);
}

void Timeline::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  closeLocked();
}

void Timeline::closeLocked() {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  enabled_.store(false, std::memory_order_relaxed);
  out_ << "\n]\n";
  out_.close();
}

int64_t Timeline::nowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_).count();
}

void Timeline::separator() {
  out_ << (first_ ? "" : ",\n");
  first_ = false;
}

int Timeline::pidOf(const std::string& op) {
  auto it = pids_.find(op);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(op, pid);
  separator();
  out_ << R"({"name": "process_name", "ph": "M", "pid": )" << pid << R"(, "args": {"name": ")" << jsonEscape(op)
       << "\"}}";
  return pid;
}

void Timeline::event(const std::string& op, const std::string& phase, char ph) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled()) return;
  const int pid = pidOf(op);
  separator();
  out_ << R"({"name": ")" << jsonEscape(phase) << R"(", "ph": ")" << ph << R"(", "ts": )" << nowUs() << R"(, "pid": )"
       << pid << R"(, "tid": 0})";
}

void Timeline::begin(const std::string& op, const std::string& phase) { event(op, phase, 'B'); }
void Timeline::end(const std::string& op, const std::string& phase) { event(op, phase, 'E'); }

void Timeline::markCycle() {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled() || !mark_cycles_) return;
  separator();
  out_ << R"({"name": "CYCLE_START", "ph": "i", "s": "p", "ts": )" << nowUs() << R"(, "pid": )" << kCyclePid
       << R"(, "tid": 0})";
}

}  // namespace hvdtorch
