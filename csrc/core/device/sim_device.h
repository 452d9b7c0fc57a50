// A simulated GPU, for testing device code paths on machines without one.
//
// What it simulates, and how:
//  * Device memory the host cannot read. Every allocation is backed by a file
//    (memfd, or a named POSIX shared-memory segment in interprocess mode)
//    mapped twice: PROT_NONE at the address handed out as the device
//    pointer, and read-write at a private address that only the device's
//    stream threads use (translating a device pointer by its offset in the
//    allocation). A host dereference of a device pointer dies with SIGSEGV.
//  * Asynchronous streams. Each stream is a thread running its queue in
//    order, sleeping a seeded random time before each operation, so work on
//    different streams interleaves differently from run to run and a missing
//    wait shows up as stale data (and, under TSan, as a data race: the only
//    happens-before edges between streams are the ones waits create).
//  * CUDA's event rules: a wait binds to the most recent record at the time
//    of the wait call; an event never recorded is complete; query() and
//    synchronize() look at the most recent record.
//  * wrapStream(native): `native` is a Stream* this device made (its
//    "native handle"), or nullptr for the device's engine stream.
//  * The arithmetic of reduce_kernels.h (the same functions, run on the
//    read-write mapping), so results are bit-identical to the CPU device's.
//  * Pinned host memory: registerHost/unregisterHost keep a table. Copies
//    through host memory not in it follow CUDA's rules for pageable memory:
//    copyToHost returns only once the copy ran; copyFromHost first waits
//    for the stream's earlier work and stages the bytes, and the copy to
//    the device runs later (either way the host waits on the stream's
//    waits for events and flags). Those on the engine stream are counted
//    (simUnpinnedEngineCopies): the engine's staging must never make one.
//  * Stream flags (writeFlag/waitFlag): 32-bit atomics in device memory
//    (shared memory in interprocess mode, so a peer process's stream sees
//    them); a waiting stream's thread polls. A wait whose value is not
//    written within SimOptions::flag_timeout_ms is reported (stderr, and the
//    device's sticky error, thrown by the next query() or synchronize()) and
//    let go, so a missing write fails a test instead of hanging it.
//  * Interprocess mode (SimOptions::interprocess): allocations live in named
//    shared memory and events made with newEvent(true) are generation
//    counters in shared memory, so exportMemory/openMemory and
//    exportEvent/openEvent work across processes as CUDA IPC does.
//
// The delays are seeded by SimOptions::seed (HVDTORCH_SIM_SEED from the
// environment, SimOptions::fromEnv) and SimOptions::rank together
// (simStreamSeed): the processes of one job share the seed, and their streams
// still sleep different delays, so one rank's stream runs ahead of or behind
// its peer's as on real GPUs. The seed is printed nowhere: tests that want a
// failure to reproduce print the seed they used (tests/harness.py picks one
// at random when HVDTORCH_SIM_SEED is unset and names it in a failure).
//
// Destruction waits for every stream's queued work, joins the threads,
// unmaps every mapping and unlinks every segment this device created.
// Allocations must be released, and opened memory closed, by then only if
// the caller wants to reuse them: the destructor frees what is left.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "device/device.h"

namespace hvdtorch {

struct SimOptions {
  int index = 0;           // DeviceId index: "sim:<index>"
  uint64_t seed = 1;       // seeds every stream's delays, with `rank`
  int rank = 0;            // the process's rank in its job (simStreamSeed)
  int max_delay_us = 200;  // each operation waits uniformly in [0, max_delay_us]
  bool interprocess = false;
  // What the device's operations cost beyond their work, as a sleep on the
  // stream's thread (no CPU taken): each copy between host and device
  // (host_copy_us) and each reduction kernel (kernel_us). Tests make one
  // route of the all-reduce measurably slower than another with them.
  int host_copy_us = 0;
  int kernel_us = 0;
  // How long a waitFlag may wait before the simulator reports it (a GPU
  // would wait forever).
  int flag_timeout_ms = 30000;

  // Defaults overridden by HVDTORCH_SIM_SEED, HVDTORCH_SIM_MAX_DELAY_US,
  // HVDTORCH_SIM_INTERPROCESS (0/1), HVDTORCH_SIM_HOST_COPY_US and
  // HVDTORCH_SIM_KERNEL_US, parsed by Config (config/config.h); a malformed
  // value throws InvalidArgument naming the variable. `rank` is the one last given to setSimRank (0 before).
  static SimOptions fromEnv();
};

// The rank SimOptions::fromEnv reports from now on, so that devices made
// afterwards (deviceFor makes them on first use) seed their streams apart
// from their peers' in other processes. hvd.init() sets it, before the
// first device tensor reaches the engine.
void setSimRank(int rank);

// The seed of stream number `stream` (0: the engine stream, then each
// newStream in order) of a device made with `options`: a function of seed,
// rank and stream, different for each rank (the same seed on two ranks
// gives unrelated delays), the same in every run with the same three.
uint64_t simStreamSeed(const SimOptions& options, uint64_t stream);

std::unique_ptr<Device> makeSimDevice(const SimOptions& options = SimOptions());

// Copies this simulated device ran on its engine stream from or to host
// memory not registered with registerHost (see countIfUnpinned). Throws
// InvalidArgument for a device that is not simulated.
uint64_t simUnpinnedEngineCopies(Device& device);

// The options this simulated device was made with (its max_delay_us,
// host_copy_us, ...: what the HVDTORCH_SIM_* knobs became). Throws
// InvalidArgument for a device that is not simulated.
SimOptions simDeviceOptions(Device& device);

// Enqueues on `stream` (nullptr: the engine stream) work that takes
// `milliseconds` without using a CPU (a sleep), standing for a long kernel:
// tests use it to make an upload land long after an op was negotiated, on
// a machine whose cores the engine threads need meanwhile. Throws
// InvalidArgument for a device that is not simulated.
void simStall(Device& device, Stream* stream, int milliseconds);

// Interprocess allocations this process released while a peer still had
// them open (openMemory without closeMemory); CUDA IPC leaves that
// undefined, so the device ring's teardown must never do it.
uint64_t simReleasedWhileOpen();

// The prefix of every shared-memory name a simulated device in this process
// creates ("/hvdtorch-sim-<pid>-"), for tests that check nothing is left.
std::string simShmPrefix();

}  // namespace hvdtorch
