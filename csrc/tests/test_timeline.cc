// Timeline: files are valid Chrome traces whether opened at construction or
// started and stopped at run time while other threads write events.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "timeline/timeline.h"

using namespace hvdtorch;

namespace {

std::string tempPath(const std::string& tag) {
  return strCat("/tmp/hvdtorch-test-timeline-", ::getpid(), "-", tag, ".json");
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A closed trace is "[", events separated by ",\n", "]": every line between
// the brackets but the last ends with a comma.
bool wellFormed(const std::string& text) {
  if (text.rfind("[\n", 0) != 0 || text.size() < 4 || text.substr(text.size() - 3) != "\n]\n") return false;
  std::istringstream lines(text.substr(2, text.size() - 5));
  std::string line, prev;
  bool first = true;
  while (std::getline(lines, line)) {
    if (!first && (prev.empty() || prev.back() != ',')) return false;
    if (line.empty() || line.front() != '{') return false;
    prev = line;
    first = false;
  }
  return first || prev.back() == '}';
}

}  // namespace

TEST(disabled_without_path_and_on_other_ranks) {
  Timeline none("", 0);
  CHECK(!none.enabled());
  none.begin("op", "NEGOTIATE");  // no file, no crash
  Timeline other(tempPath("rank1"), 1);
  CHECK(!other.enabled());
  std::ifstream in(tempPath("rank1"));
  CHECK(!in.good());
}

TEST(start_stop_at_run_time) {
  Timeline t("", 0);
  const std::string a = tempPath("a"), b = tempPath("b");
  t.start(a, 0, false);
  CHECK(t.enabled());
  t.begin("grad.w", "NEGOTIATE");
  t.end("grad.w", "NEGOTIATE");
  t.markCycle();        // not asked for: nothing written
  t.start(b, 0, true);  // switches files, closing the first
  t.markCycle();
  t.begin("grad.b", "QUEUE");
  t.stop();
  t.stop();  // idempotent
  CHECK(!t.enabled());
  t.begin("late", "QUEUE");  // after stop: ignored
  const std::string ta = slurp(a), tb = slurp(b);
  CHECK_MSG(wellFormed(ta), "%s", ta.c_str());
  CHECK_MSG(wellFormed(tb), "%s", tb.c_str());
  CHECK(count(ta, "\"grad.w\"") == 1 && count(ta, "\"ph\": \"B\"") == 1 && count(ta, "\"ph\": \"E\"") == 1);
  CHECK(count(ta, "CYCLE_START") == 0 && count(ta, "grad.b") == 0);
  CHECK(count(tb, "CYCLE_START") == 1 && count(tb, "grad.b") == 1 && count(tb, "late") == 0);
  std::remove(a.c_str());
  std::remove(b.c_str());
}

TEST(rank_placeholder_and_unwritable_path) {
  Timeline t("", 3);
  const std::string pattern = tempPath("r{rank}");
  t.start(pattern, 3, false);
  CHECK(t.enabled());
  t.stop();
  const std::string file = tempPath("r3");
  CHECK(wellFormed(slurp(file)));
  std::remove(file.c_str());
  CHECK_THROWS(t.start("/nonexistent-dir/x.json", 0, false), InvalidArgument);
  CHECK(!t.enabled());
}

TEST(concurrent_writers_while_starting_and_stopping) {
  Timeline t("", 0);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; !stop; ++i) {
        const std::string op = strCat("op", w, ".", i % 7);
        t.begin(op, "ALLREDUCE");
        t.end(op, "ALLREDUCE");
        t.markCycle();
      }
    });
  std::vector<std::string> files;
  for (int k = 0; k < 20; ++k) {
    files.push_back(tempPath(strCat("c", k)));
    t.start(files.back(), 0, k % 2 == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (k % 3 == 0) t.stop();
  }
  t.stop();
  stop = true;
  for (auto& th : writers) th.join();
  for (const auto& f : files) {
    const std::string text = slurp(f);
    CHECK_MSG(wellFormed(text), "%s is not a closed trace", f.c_str());
    std::remove(f.c_str());
  }
}

HVD_TEST_MAIN()
