#include "common/thread_placement.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <sstream>

#include "common/error.h"

namespace hvdtorch {

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> engineThreadCpus(const std::string& setting, const std::vector<int>& allowed, int online_cpus,
                                  int local_rank, int local_size) {
  if (setting == "off") return {};
  if (setting == "auto") {
    const int n = static_cast<int>(allowed.size());
    if (n != online_cpus || local_size < 1 || n < local_size) return {};
    const auto share = static_cast<std::ptrdiff_t>(n / local_size);
    const auto first = allowed.begin() + static_cast<std::ptrdiff_t>(local_rank) * share;
    return std::vector<int>(first, first + share);
  }
  std::vector<int> per_rank;
  std::stringstream in(setting);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int cpu = -1;
    try {
      cpu = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || cpu < 0)
      throw InvalidArgument(strCat("HVDTORCH_THREAD_AFFINITY: '", item, "' in '", setting,
                                   "' is not a CPU number (expected auto, off or one CPU per local rank, e.g. 0,4)"));
    per_rank.push_back(cpu);
  }
  if (static_cast<int>(per_rank.size()) != local_size)
    throw InvalidArgument(strCat("HVDTORCH_THREAD_AFFINITY: '", setting, "' names ", per_rank.size(),
                                 " CPUs, but this host runs ", local_size, " ranks (one CPU per local rank)"));
  // Every entry is checked, not only this rank's: the ranks of a host see
  // the same list, so all of them refuse it together in init() rather than
  // one failing while the others wait for it in the first collective.
  for (size_t i = 0; i < per_rank.size(); ++i) {
    if (std::find(allowed.begin(), allowed.end(), per_rank[i]) != allowed.end()) continue;
    std::string mask;
    for (int a : allowed) {
      if (!mask.empty()) mask += ",";
      mask += std::to_string(a);
    }
    throw InvalidArgument(strCat("HVDTORCH_THREAD_AFFINITY: CPU ", per_rank[i], " (local rank ", i,
                                 "'s) is not among the CPUs this process may use (", mask,
                                 "); where the launcher binds ranks itself (mpirun), leave the knob at auto"));
  }
  const int cpu = per_rank[local_rank];
  return {cpu};
}

namespace {
std::mutex g_mu;
std::vector<int> g_cpus;
}  // namespace

void setEngineThreadCpus(std::vector<int> cpus) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_cpus = std::move(cpus);
}

std::vector<int> engineThreadCpus() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_cpus;
}

void placeEngineThread(const char* name) {
  pthread_setname_np(pthread_self(), std::string(name).substr(0, 15).c_str());
  const std::vector<int> cpus = engineThreadCpus();
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace hvdtorch
