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

}  // namespace

Timeline::Timeline(const std::string& path, int rank) {
  if (path.empty()) return;
  std::string file = path;
  const auto at = file.find("{rank}");
  if (at != std::string::npos) {
    file.replace(at, 6, std::to_string(rank));
  } else if (rank != 0) {
    return;
  }
  out_.open(file, std::ios::out | std::ios::trunc);
  if (!out_) throw InvalidArgument(strCat("HVDTORCH_TIMELINE: cannot write '", file, "'"));
  out_ << "[\n";
  start_ = std::chrono::steady_clock::now();
  enabled_ = true;
}

Timeline::~Timeline() { close(); }

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_) return;
  enabled_ = false;
  out_ << "\n]\n";
  out_.close();
}

int Timeline::pidOf(const std::string& op) {
  auto it = pids_.find(op);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(op, pid);
  out_ << (first_ ? "" : ",\n") << R"({"name": "process_name", "ph": "M", "pid": )" << pid
       << R"(, "args": {"name": ")" << jsonEscape(op) << "\"}}";
  first_ = false;
  return pid;
}

void Timeline::event(const std::string& op, const std::string& phase, char ph) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_) return;
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_).count();
  const int pid = pidOf(op);
  out_ << (first_ ? "" : ",\n") << R"({"name": ")" << jsonEscape(phase) << R"(", "ph": ")" << ph
       << R"(", "ts": )" << us << R"(, "pid": )" << pid << R"(, "tid": 0})";
  first_ = false;
}

void Timeline::begin(const std::string& op, const std::string& phase) { event(op, phase, 'B'); }
void Timeline::end(const std::string& op, const std::string& phase) { event(op, phase, 'E'); }

}  // namespace hvdtorch
