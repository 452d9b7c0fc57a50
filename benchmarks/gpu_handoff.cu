// How long one hand-over between two processes sharing a GPU takes, by the
// ways the device ring can order its steps (make gpu-check PHASE=bench runs it on the
// GPU machine: nvcc -O2 -arch=sm_90 -o handoff benchmarks/gpu_handoff.cu, no
// -lcuda: the driver's stream memory operations are reached through the
// runtime, as the library does).
//
//   event      IPC events: each side records its event, publishes on the host
//              that it did, and the other side's stream waits on it (the
//              device ring's protocol before stream flags).
//   flag-host  32-bit flags in shared host memory, registered and mapped into
//              both processes: each stream writes the peer's flag
//              (cuStreamWriteValue32) and waits on its own (cuStreamWaitValue32),
//              the whole ping-pong enqueued up front; the host only enqueues.
//   flag-dev   the same with the flags in device memory shared through CUDA IPC.
//   spin-dev   the same with a one-thread spin kernel and a write kernel
//              instead of the stream memory operations.
// and, for the scale of it, one 256 MiB device copy on each process at once
// and on one process alone.
//
// Prints one line per mode: microseconds per round trip (median of 5 runs
// of --rounds round trips, min-max).
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct Shared {  // host memory both processes map
  std::atomic<int> phase[2];
  std::atomic<uint32_t> recorded[2];  // event mode: records made by each side
  cudaIpcMemHandle_t mem;
  cudaIpcEventHandle_t ev[2];
  alignas(64) uint32_t host_flag[2][16];  // flag-host: [side][0]
  double result[8];
};

__global__ void spinWait(volatile uint32_t* flag, uint32_t value) {
  while (static_cast<int32_t>(*flag - value) < 0) __nanosleep(100);
}
__global__ void writeKernel(volatile uint32_t* flag, uint32_t value) {
  __threadfence_system();
  *flag = value;
}

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void barrier(Shared* s, int me, int& gen) {
  ++gen;
  s->phase[me].store(gen);
  while (s->phase[1 - me].load() < gen) {
  }
}

int main(int argc, char** argv) {
  const int rounds_asked = argc > 1 ? std::atoi(argv[1]) : 2000;
  const char* name = "/hvdtorch-gpu-handoff";
  shm_unlink(name);
  int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, 1 << 16) != 0) return 2;
  auto* s = static_cast<Shared*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  std::memset(static_cast<void*>(s), 0, 1 << 16);
  shm_unlink(name);
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0, peer = 1 - me;
  int gen = 0;
  CK(cudaSetDevice(0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  WaitFn waitv = nullptr;
  WriteFn writev = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", reinterpret_cast<void**>(&waitv), 12000, cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", reinterpret_cast<void**>(&writev), 12000, cudaEnableDefault, &q));
  // Device flags: side 0 allocates two, side 1 opens them.
  uint32_t* dflags = nullptr;
  if (me == 0) {
    CK(cudaMalloc(&dflags, 256));
    CK(cudaMemset(dflags, 0, 256));
    CK(cudaDeviceSynchronize());
    CK(cudaIpcGetMemHandle(&s->mem, dflags));
  }
  cudaEvent_t ev[2];
  cudaEvent_t mine;
  CK(cudaEventCreateWithFlags(&mine, cudaEventDisableTiming | cudaEventInterprocess));
  CK(cudaIpcGetEventHandle(&s->ev[me], mine));
  barrier(s, me, gen);
  if (me == 1) CK(cudaIpcOpenMemHandle(reinterpret_cast<void**>(&dflags), s->mem, cudaIpcMemLazyEnablePeerAccess));
  ev[me] = mine;
  CK(cudaIpcOpenEventHandle(&ev[peer], s->ev[peer]));
  CK(cudaHostRegister(s, 1 << 16, cudaHostRegisterMapped | cudaHostRegisterPortable));
  uint32_t* hflags_dev = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&hflags_dev), s->host_flag, 0));
  const size_t big = 256u << 20;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, big));
  CK(cudaMalloc(&b, big));
  CK(cudaMemset(a, 1, big));
  CK(cudaDeviceSynchronize());
  barrier(s, me, gen);

  const char* modes[] = {"event", "flag-host", "flag-dev", "spin-dev", "copy-256MiB-both", "copy-256MiB-alone"};
  uint32_t base = 0;  // flags only grow across runs
  for (int m = 0; m < 6; ++m) {
    // The spinning kernel takes milliseconds a round trip: fewer of them.
    const int rounds = m == 3 ? std::max(20, rounds_asked / 50) : rounds_asked;
    std::vector<double> runs;
    for (int run = 0; run < 5; ++run) {
      barrier(s, me, gen);
      const double t0 = now();
      if (m == 0) {
        // Ping-pong: side 0 records first; each wait is issued after the host saw the record made.
        for (int i = 1; i <= rounds; ++i) {
          if (me == 1 || i > 1) {
            const uint32_t want = me == 0 ? static_cast<uint32_t>(i - 1) + base : static_cast<uint32_t>(i) + base;
            while (static_cast<int32_t>(s->recorded[peer].load() - want) < 0) {
            }
            CK(cudaStreamWaitEvent(st, ev[peer], 0));
          }
          CK(cudaEventRecord(ev[me], st));
          s->recorded[me].store(static_cast<uint32_t>(i) + base);
        }
      } else if (m <= 3) {
        uint32_t* flags = m == 1 ? hflags_dev : dflags;
        uint32_t* my_flag = flags + (m == 1 ? me * 16 : me * 16);
        uint32_t* peer_flag = flags + peer * 16;
        for (int i = 1; i <= rounds; ++i) {
          const uint32_t v = static_cast<uint32_t>(i) + base;
          if (me == 1) {  // wait then answer
            if (m == 3) spinWait<<<1, 1, 0, st>>>(my_flag, v); else if (waitv(st, reinterpret_cast<CUdeviceptr>(my_flag), v, CU_STREAM_WAIT_VALUE_GEQ)) return 3;
            if (m == 3) writeKernel<<<1, 1, 0, st>>>(peer_flag, v); else if (writev(st, reinterpret_cast<CUdeviceptr>(peer_flag), v, 0)) return 3;
          } else {
            if (m == 3) writeKernel<<<1, 1, 0, st>>>(peer_flag, v); else if (writev(st, reinterpret_cast<CUdeviceptr>(peer_flag), v, 0)) return 3;
            if (m == 3) spinWait<<<1, 1, 0, st>>>(my_flag, v); else if (waitv(st, reinterpret_cast<CUdeviceptr>(my_flag), v, CU_STREAM_WAIT_VALUE_GEQ)) return 3;
          }
        }
      } else if (m == 4 || me == 0) {
        CK(cudaMemcpyAsync(b, a, big, cudaMemcpyDeviceToDevice, st));
      }
      CK(cudaStreamSynchronize(st));
      const double t = now() - t0;
      base += static_cast<uint32_t>(rounds);
      barrier(s, me, gen);
      runs.push_back(m >= 4 ? t * 1e6 : t * 1e6 / rounds);
    }
    std::sort(runs.begin(), runs.end());
    if (me == 0)
      std::printf("%-18s %10.2f us  [%.2f-%.2f]%s\n", modes[m], runs[2], runs[0], runs[4],
                  m >= 4 ? " per copy" : " per round trip");
    std::fflush(stdout);
  }
  barrier(s, me, gen);
  if (me == 0) {
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 4;
  }
  return 0;
}
