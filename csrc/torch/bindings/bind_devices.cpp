// Device facts for tests and tools: the simulated device (its mode, its
// counters, its options), what ran on the device ring, the device group or
// alone, the device calibration, and the cleanup of shared memory dead jobs
// left behind.
#include <torch/extension.h>

#include "bindings/bindings.h"
#include "c10d_device_collectives.h"
#include "device/devices.h"
#include "device/sim_device.h"
#include "engine/engine.h"
#include "ops/allreduce.h"
#include "output_pool.h"
#include "tensor_binding.h"
#include "transport/shm/segment.h"

namespace py = pybind11;

namespace hvdtorch {

void bindDevices(py::module_& m) {
  // HVDTORCH_SIM_DEVICE=1 (tensor_binding.h): CPU tensors reach the engine as simulated-device memory. The count
  // is of copies the engine made on sim:0's engine stream through host memory it had not registered (none should).
  m.def("sim_device_mode", &simDeviceMode);
  m.def("sim_unpinned_engine_copies", [] { return simUnpinnedEngineCopies(deviceFor(DeviceId{DeviceKind::kSim, 0})); });
  // Interprocess simulated memory this process freed while a peer still had it open (none should be).
  m.def("sim_released_while_open", &simReleasedWhileOpen);
  // hvd.init() gives simulated devices the rank to seed their streams with; tests read the seeds.
  m.def("set_sim_rank", &setSimRank);
  m.def("sim_stream_seed", [](uint64_t stream) { return simStreamSeed(SimOptions::fromEnv(), stream); });
  // The options sim:0 was made with (made now if it was not yet): what the HVDTORCH_SIM_* knobs became there.
  m.def("sim_device_options", [] {
    const SimOptions o = simDeviceOptions(deviceFor(DeviceId{DeviceKind::kSim, 0}));
    py::dict d;
    d["seed"] = o.seed;
    d["max_delay_us"] = o.max_delay_us;
    d["interprocess"] = o.interprocess;
    d["host_copy_us"] = o.host_copy_us;
    d["kernel_us"] = o.kernel_us;
    return d;
  });
  // All-reduces this process ran on the device ring (algorithms/device_ring.h), for tests.
  m.def("device_ring_runs", &Engine::deviceRingRuns);
  // All-reduces this process ran through the device group (c10d_device_collectives.h), for tests.
  m.def("device_native_runs", &C10dDeviceCollectives::runs);
  // All-reduces of device tensors this process ran alone (a set of one rank), on the device (ops/allreduce.h).
  m.def("device_one_rank_runs", &ops::oneRankDeviceAllreduces);
  // Device calibrations this process ran for reducer=auto, and the last one's times (algorithms/device_router.h).
  m.def("device_calibrations", &deviceCalibrations);
  m.def("last_device_calibration", &lastDeviceCalibration);
  // The output pool (output_pool.h): fresh host outputs, and what it holds and served.
  // An empty contiguous tensor of `like`'s shape and dtype on pooled memory (`like` on the CPU).
  m.def("pooled_empty_like",
        [](const at::Tensor& like) { return OutputPool::instance().empty(like.sizes(), like.scalar_type()); });
  m.def("output_pool_stats", [] {
    const OutputPool::Stats s = OutputPool::instance().stats();
    py::dict d;
    d["limit_bytes"] = s.limit;
    d["kept_bytes"] = s.kept_bytes;
    d["kept_blocks"] = s.kept_blocks;
    d["reused"] = s.reused;
    d["fresh"] = s.fresh;
    d["returned"] = s.returned;
    d["dropped"] = s.dropped;
    return d;
  });
  // Removes what killed jobs left in /dev/shm (segments of hvdtorch jobs whose creator is dead); init() calls it.
  m.def("remove_dead_shm_segments", [] { return ShmSegment::removeDeadJobSegments(); });
}

}  // namespace hvdtorch
