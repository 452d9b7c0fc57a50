// Every tunable of the engine. Each is an HVDTORCH_* environment variable
// with the default below, and can be overridden from Python
// (hvd.init(timeout=30, fusion_threshold=...)): the key is the variable name
// without the prefix, lower-cased. knobs() lists them for docs and errors.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hvdtorch {

struct Config {
  std::chrono::milliseconds timeout{std::chrono::seconds(600)};       // HVDTORCH_TIMEOUT (s)
  std::chrono::milliseconds stall_warning{std::chrono::seconds(60)};  // HVDTORCH_STALL_CHECK_TIME (s)
  std::chrono::microseconds cycle_time{1000};                         // HVDTORCH_CYCLE_TIME (ms)
  size_t fusion_threshold = 64u << 20;                                // HVDTORCH_FUSION_THRESHOLD (bytes)
  size_t cache_capacity = 1024;                                       // HVDTORCH_CACHE_CAPACITY
  bool decentralized = true;                                          // HVDTORCH_DECENTRALIZED
  std::string reducer = "auto";                                       // HVDTORCH_REDUCER
  bool shm = true;                                                    // HVDTORCH_SHM
  size_t ring_segment_bytes = 1u << 20;                               // HVDTORCH_RING_SEGMENT_BYTES
  int ring_window = 4;                                                // HVDTORCH_RING_WINDOW
  bool device_ring = true;                                            // HVDTORCH_DEVICE_RING
  size_t device_ring_slot_bytes = 32u << 20;                          // HVDTORCH_DEVICE_RING_SLOT_BYTES
  uint32_t device_ring_slots = 2;                                     // HVDTORCH_DEVICE_RING_SLOTS
  size_t staging_segment_bytes = 8u << 20;                            // HVDTORCH_STAGING_SEGMENT_BYTES
  size_t device_calibration_bytes = 64u << 20;                        // HVDTORCH_DEVICE_CALIBRATION_BYTES
  int central_shards = 1;                                             // HVDTORCH_CENTRAL_SHARDS
  // Read by the adapter (csrc/torch/output_pool.h), not by the engine.
  size_t output_pool_bytes = 256u << 20;  // HVDTORCH_OUTPUT_POOL_BYTES
  bool calibrate = true;                  // HVDTORCH_CALIBRATE
  std::string thread_affinity = "auto";   // HVDTORCH_THREAD_AFFINITY
  std::string timeline;                   // HVDTORCH_TIMELINE (path)
  std::string hostname;                   // HVDTORCH_HOSTNAME (empty: the real one)
  // Read by the Python tuner (hvdtorch/autotune.py), not by the engine.
  bool autotune = false;             // HVDTORCH_AUTOTUNE
  std::string autotune_log;          // HVDTORCH_AUTOTUNE_LOG (path; empty: no log)
  int autotune_warmup_steps = 1;     // HVDTORCH_AUTOTUNE_WARMUP_STEPS
  int autotune_steps_per_trial = 5;  // HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL
  int autotune_rounds = 2;           // HVDTORCH_AUTOTUNE_ROUNDS
  // The simulated device (tests; device/sim_device.h). Environment only
  // (Knob::environment_only): read when the adapter first binds a tensor
  // (sim_device, tensor_binding.cpp) and when a simulated device is made
  // (the others, SimOptions::fromEnv), both of which may precede hvd.init().
  bool sim_device = false;        // HVDTORCH_SIM_DEVICE
  uint64_t sim_seed = 1;          // HVDTORCH_SIM_SEED
  int sim_max_delay_us = 200;     // HVDTORCH_SIM_MAX_DELAY_US
  bool sim_interprocess = false;  // HVDTORCH_SIM_INTERPROCESS
  int sim_host_copy_us = 0;       // HVDTORCH_SIM_HOST_COPY_US
  int sim_kernel_us = 0;          // HVDTORCH_SIM_KERNEL_US

  struct Knob {
    std::string name;  // without the HVDTORCH_ prefix
    std::string default_value;
    std::string help;
    // Set only from the environment: load() refuses it among `overrides`.
    bool environment_only = false;
  };
  static const std::vector<Knob>& knobs();

  // Defaults, then HVDTORCH_* from the environment, then `overrides`
  // (keys as in knobs(), lower or upper case). Bad values throw
  // InvalidArgument naming the variable.
  static Config load(const std::map<std::string, std::string>& overrides = {});
  // Defaults, then only the knobs `names` (as in knobs()) from the
  // environment: for code that reads its own few knobs without an engine
  // (the simulated device), so a bad value of another knob is not its error.
  static Config loadFromEnvironment(const std::vector<std::string>& names);
  void set(const std::string& key, const std::string& value);
};

}  // namespace hvdtorch
