// Where the engine's own threads run (the control thread, the executor and
// the shared-memory sender threads), as the knob THREAD_AFFINITY says.
//
// Why: mpirun binds every rank to a core; torchrun binds nothing, so the
// threads of all a host's ranks float over its cores, and two ranks'
// executors (which copy and reduce, and spin briefly on shared memory while
// waiting for each other) land on one core often enough to cost 1.2-1.7x an
// all-reduce's time (BENCHMARKS.md, "torchrun against mpirun"). Pinning only
// the engine's threads leaves the user's threads (the training loop, its
// DataLoader workers, intra-op threads) where they were: binding the whole
// process would bind every worker it forks as well.
//
// Contract: the engine decides once per init() (setEngineThreadCpus) before
// it starts a thread; every engine thread calls placeEngineThread() first.
// An empty set means "leave the thread where the OS puts it".
#pragma once

#include <string>
#include <vector>

namespace hvdtorch {

// The CPUs this process may run on (its affinity mask), ascending.
std::vector<int> allowedCpus();

// The CPUs the engine threads of local rank `local_rank` (of `local_size`
// on this host) should use, for the knob's value `setting`:
//   "off"       -> {} (never pin);
//   "auto"      -> {} when something has already placed this process (its
//                  mask is not every online CPU: mpirun's binding, taskset,
//                  a container's cpuset) or the host's ranks outnumber the
//                  CPUs; otherwise local rank i gets the i-th of local_size
//                  equal slices of the CPUs;
//   "3,7,..."   -> {entry local_rank} (one CPU per local rank, as many
//                  entries as local ranks).
// Throws InvalidArgument for a malformed list, one of the wrong length, or
// one naming a CPU outside `allowed` (any entry, not only this rank's: the
// host's ranks then refuse the same list together).
std::vector<int> engineThreadCpus(const std::string& setting, const std::vector<int>& allowed, int online_cpus,
                                  int local_rank, int local_size);

// Process-wide (one engine per process): the set engine threads take.
void setEngineThreadCpus(std::vector<int> cpus);
std::vector<int> engineThreadCpus();

// Names the calling thread (`name` up to 15 characters, as `top -H` and
// debuggers show it) and pins it to the engine's CPUs when there are any.
// A failure to pin is not an error: the thread runs unpinned.
void placeEngineThread(const char* name);

}  // namespace hvdtorch
