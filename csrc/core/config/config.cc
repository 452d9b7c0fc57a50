#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "common/error.h"

namespace hvdtorch {

const std::vector<Config::Knob>& Config::knobs() {
  // The meanings are the README's knob table (tools/gen_docs.py writes it from here).
  static const std::vector<Knob> k = {
      {"TIMEOUT", "600",
       "seconds an operation may wait for its peers, all its waits together (one deadline per operation), before it "
       "fails on every rank"},
      {"STALL_CHECK_TIME", "60", "seconds before a warning names the ranks that have not submitted an op"},
      {"CYCLE_TIME", "1", "milliseconds between negotiation cycles of the background thread"},
      {"FUSION_THRESHOLD", "67108864", "bytes of the engine's fusion buffer; 0 disables fusion"},
      {"CACHE_CAPACITY", "1024",
       "negotiated ops remembered by the response cache (full: the least recently used is evicted, the same one "
       "on every rank); 0 disables it"},
      {"DECENTRALIZED", "1",
       "settle cycles whose ops are all cached by a bitwise-AND all-reduce among the ranks (O(log N) messages per "
       "rank, no coordinator); 0: every cycle goes through rank 0; must be the same on every rank"},
      {"REDUCER", "auto",
       "default all-reduce algorithm: auto, ring, node, central, native, adasum (adasum makes every Average/Sum "
       "all-reduce Adasum)"},
      {"SHM", "1", "use shared memory between ranks on the same host; 0 forces the c10d link"},
      {"RING_SEGMENT_BYTES", "1048576", "bytes per pipelined segment of the ring on host memory"},
      {"RING_WINDOW", "4", "ring segments in flight at once"},
      {"DEVICE_RING", "1",
       "device tensors may take the device ring (GPU memory shared between the processes of a host through CUDA "
       "IPC); 0: never (where the processes cannot share GPU memory, as in containers without a shared IPC "
       "namespace); must be the same on every rank"},
      {"DEVICE_RING_SLOT_BYTES", "33554432",
       "bytes of each slot of the device ring's inbox (GPU memory, HVDTORCH_DEVICE_RING_SLOTS of them per rank; a "
       "link to another host also pins four host slots): each segment costs the two neighbours a hand-over on the "
       "GPU, so small slots leave the ring waiting on them; must be the same on every rank"},
      {"DEVICE_RING_SLOTS", "2",
       "slots of the device ring's inbox per rank, 1 to 16: segments in flight on a link; must be the same on every "
       "rank"},
      {"STAGING_SEGMENT_BYTES", "8388608",
       "bytes per segment of an all-reduce of device tensors staged through host memory: the copies of each "
       "segment to and from the GPU overlap the host reduction of the others; 0: the whole unit at once; must be "
       "the same on every rank"},
      {"DEVICE_CALIBRATION_BYTES", "67108864",
       "largest all-reduce that reducer=auto times on each route for device tensors (the device group, the device "
       "ring, staging through each host reducer; from 4 KiB up by factors of 4 to this size), once, in the first "
       "such all-reduce where more than one route applies (a process set starts from the global set's); auto then "
       "takes the fastest measured route per size unless its rule's route (the device group where it serves, the "
       "device ring on one host, staging otherwise) is within 8%; 0: the rule alone; must be the same on every "
       "rank"},
      {"CENTRAL_SHARDS", "1", "parameter-server shards of the central reducer"},
      {"OUTPUT_POOL_BYTES", "268435456",
       "bytes of freed host memory kept for the fresh outputs of the collectives (hvd.allreduce(x), allgather, "
       "broadcast, alltoall, reducescatter, reduce on CPU tensors of 128 KiB or more), so that a repeated call "
       "reuses memory already mapped instead of faulting in new pages; 0: every output is torch's fresh "
       "allocation"},
      {"TIMELINE", "",
       "Chrome-trace file written by rank 0 from init() on ({rank} in the path: one file per rank); phases "
       "NEGOTIATE, QUEUE, MEMCPY_IN_FUSION, ALLREDUCE:<reducer>, MEMCPY_OUT_FUSION, ALLGATHER, BROADCAST, "
       "ALLTOALL, REDUCESCATTER per op (and DEVICE_CALIBRATION on the op that timed the device routes); "
       "hvd.start_timeline()/stop_timeline() do the same at run time; empty: off"},
      {"CALIBRATE", "1", "time the reducers at 4-64 KiB at init for reducer=auto; 0 leaves that to the online timing"},
      {"THREAD_AFFINITY", "auto",
       "CPUs of the engine's own threads (control, executor, shared-memory senders; never the caller's threads "
       "or its DataLoader workers): auto pins local rank i's to the i-th equal slice of the CPUs when nothing has "
       "placed the process (torchrun; mpirun binds ranks itself) and the host's ranks do not outnumber its CPUs; "
       "off: never; a list such as 0,4: local rank i's threads on the i-th CPU"},
      {"HOSTNAME", "",
       "this rank's host identity: ranks with equal names share memory (emulates several hosts on one machine); "
       "empty: the real host name"},
      {"AUTOTUNE", "0",
       "1: over the first training steps, try fusion sizes (0, 1, 4, 16, 64 MiB: the bucket cap of the first "
       "DistributedModel/DistributedOptimizer and the engine's fusion threshold) and then cycle times (0.2, 1, "
       "5 ms), score each by measured throughput agreed across ranks, and freeze the best (Horovod's "
       "HOROVOD_AUTOTUNE; design in hvdtorch/autotune.py)"},
      {"AUTOTUNE_LOG", "",
       "CSV file where rank 0 writes every autotune trial: trial,fusion_bytes,cycle_time_ms,score,median_step_s,"
       "chosen (score: gradient bytes per second); empty: no log"},
      {"AUTOTUNE_WARMUP_STEPS", "1",
       "steps run untimed after each autotune switch of settings (new bucket names are negotiated once)"},
      {"AUTOTUNE_STEPS_PER_TRIAL", "5",
       "timed steps per autotune trial; the score uses their median (each step timed by its slowest rank)"},
      {"AUTOTUNE_ROUNDS", "2",
       "autotune trials per candidate, in alternating order (A B C, C B A) so that a drift in load favours none; "
       "a candidate scores the median of its trials"},
      {"SIM_DEVICE", "0",
       "tests: 1 hands every CPU tensor to the engine as simulated-device memory (the GPU code paths on a CPU)", true},
      {"SIM_SEED", "1",
       "simulated device (tests): base seed of its streams' random delays; each rank mixes in its rank, so ranks "
       "sleep different delays; the test harness draws it at random per job when unset and names it in a failure",
       true},
      {"SIM_MAX_DELAY_US", "200", "simulated device (tests): longest random delay of one operation, in us", true},
      {"SIM_INTERPROCESS", "0", "simulated device (tests): 1 keeps its memory and events in shared memory", true},
      {"SIM_HOST_COPY_US", "0", "simulated device (tests): extra cost of each copy to or from the host, in us", true},
      {"SIM_KERNEL_US", "0", "simulated device (tests): extra cost of each reduction kernel, in us", true},
  };
  return k;
}

namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

double toNumber(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end == v.c_str() || *end != '\0' || d < 0)
    throw InvalidArgument(strCat("HVDTORCH_", key, "='", v, "': expected a non-negative number"));
  return d;
}

// An integer in [lo, hi], written in decimal.
int64_t toInt(const std::string& key, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || errno != 0 || *end != '\0' || x < lo || x > hi)
    throw InvalidArgument(strCat("HVDTORCH_", key, "='", v, "': expected an integer in [", lo, ", ", hi, "]"));
  return x;
}

bool toBool(const std::string& key, const std::string& v) {
  const std::string u = upper(v);
  if (u == "1" || u == "TRUE" || u == "YES" || u == "ON") return true;
  if (u == "0" || u == "FALSE" || u == "NO" || u == "OFF") return false;
  throw InvalidArgument(strCat("HVDTORCH_", key, "='", v, "': expected a boolean (0 or 1)"));
}

}  // namespace

void Config::set(const std::string& raw_key, const std::string& v) {
  std::string key = upper(raw_key);
  if (key.rfind("HVDTORCH_", 0) == 0) key = key.substr(9);
  using std::chrono::microseconds;
  using std::chrono::milliseconds;
  if (key == "TIMEOUT") {
    timeout = milliseconds(static_cast<long long>(toNumber(key, v) * 1000));
    if (timeout.count() <= 0) throw InvalidArgument(strCat("HVDTORCH_TIMEOUT='", v, "': expected a positive number"));
  } else if (key == "STALL_CHECK_TIME") {
    stall_warning = milliseconds(static_cast<long long>(toNumber(key, v) * 1000));
  } else if (key == "CYCLE_TIME") {
    cycle_time = microseconds(static_cast<long long>(toNumber(key, v) * 1000));
  } else if (key == "FUSION_THRESHOLD") {
    fusion_threshold = static_cast<size_t>(toNumber(key, v));
  } else if (key == "CACHE_CAPACITY") {
    cache_capacity = static_cast<size_t>(toNumber(key, v));
  } else if (key == "DECENTRALIZED") {
    decentralized = toBool(key, v);
  } else if (key == "REDUCER") {
    reducer = v;
  } else if (key == "SHM") {
    shm = toBool(key, v);
  } else if (key == "RING_SEGMENT_BYTES") {
    ring_segment_bytes = std::max<size_t>(64, static_cast<size_t>(toNumber(key, v)));
  } else if (key == "DEVICE_RING") {
    device_ring = toBool(key, v);
  } else if (key == "DEVICE_RING_SLOT_BYTES") {
    device_ring_slot_bytes = std::max<size_t>(64, static_cast<size_t>(toNumber(key, v)));
  } else if (key == "DEVICE_RING_SLOTS") {
    device_ring_slots = static_cast<uint32_t>(toInt(key, v, 1, 16));
  } else if (key == "OUTPUT_POOL_BYTES") {
    output_pool_bytes = static_cast<size_t>(toNumber(key, v));
  } else if (key == "STAGING_SEGMENT_BYTES") {
    staging_segment_bytes = static_cast<size_t>(toNumber(key, v));
  } else if (key == "DEVICE_CALIBRATION_BYTES") {
    device_calibration_bytes = static_cast<size_t>(toNumber(key, v));
  } else if (key == "RING_WINDOW") {
    ring_window = std::max(1, static_cast<int>(toNumber(key, v)));
  } else if (key == "TIMELINE") {
    timeline = v;
  } else if (key == "HOSTNAME") {
    hostname = v;
  } else if (key == "THREAD_AFFINITY") {
    thread_affinity = v;
  } else if (key == "CALIBRATE") {
    calibrate = toBool(key, v);
  } else if (key == "AUTOTUNE") {
    autotune = toBool(key, v);
  } else if (key == "AUTOTUNE_LOG") {
    autotune_log = v;
  } else if (key == "AUTOTUNE_WARMUP_STEPS") {
    autotune_warmup_steps = static_cast<int>(toNumber(key, v));
  } else if (key == "AUTOTUNE_STEPS_PER_TRIAL") {
    autotune_steps_per_trial = static_cast<int>(toNumber(key, v));
    if (autotune_steps_per_trial < 1)
      throw InvalidArgument(strCat("HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL='", v, "': expected an integer of at least 1"));
  } else if (key == "AUTOTUNE_ROUNDS") {
    autotune_rounds = std::max(1, static_cast<int>(toNumber(key, v)));
  } else if (key == "CENTRAL_SHARDS") {
    central_shards = std::max(1, static_cast<int>(toNumber(key, v)));
  } else if (key == "SIM_DEVICE") {
    if (v.empty() || v == "0") {
      sim_device = false;
    } else if (v == "1") {
      sim_device = true;
    } else {
      throw InvalidArgument(strCat("HVDTORCH_SIM_DEVICE='", v, "': expected 0 or 1"));
    }
  } else if (key == "SIM_SEED") {
    sim_seed = static_cast<uint64_t>(toInt(key, v, 0, std::numeric_limits<int64_t>::max()));
  } else if (key == "SIM_MAX_DELAY_US") {
    sim_max_delay_us = static_cast<int>(toInt(key, v, 0, 1000000));
  } else if (key == "SIM_INTERPROCESS") {
    sim_interprocess = toInt(key, v, 0, 1) != 0;
  } else if (key == "SIM_HOST_COPY_US") {
    sim_host_copy_us = static_cast<int>(toInt(key, v, 0, 1000000));
  } else if (key == "SIM_KERNEL_US") {
    sim_kernel_us = static_cast<int>(toInt(key, v, 0, 1000000));
  } else {
    std::string names;
    for (const auto& k : knobs()) names += (names.empty() ? "" : ", ") + k.name;
    throw InvalidArgument(strCat("unknown hvdtorch option '", raw_key, "'; known: ", names));
  }
}

Config Config::load(const std::map<std::string, std::string>& overrides) {
  Config c;
  for (const auto& k : knobs()) {
    const char* env = std::getenv(("HVDTORCH_" + k.name).c_str());
    if (env != nullptr && *env != '\0') c.set(k.name, env);
  }
  for (const auto& [key, value] : overrides) {
    std::string name = upper(key);
    if (name.rfind("HVDTORCH_", 0) == 0) name = name.substr(9);
    for (const auto& k : knobs())
      if (k.name == name && k.environment_only)
        throw InvalidArgument(
            strCat("hvdtorch option '", key, "' is read from the environment only (HVDTORCH_", name, ")"));
    c.set(key, value);
  }
  return c;
}

Config Config::loadFromEnvironment(const std::vector<std::string>& names) {
  Config c;
  for (const auto& name : names) {
    const char* env = std::getenv(("HVDTORCH_" + name).c_str());
    if (env != nullptr && *env != '\0') c.set(name, env);
  }
  return c;
}

}  // namespace hvdtorch
