// Every op, reducer and dtype through the engine on device tensors
// (sim_tensors.h): the executor's staging (engine/execution/host_staging.h) and the
// all-reduce's staging through the fusion buffer, with the ready and
// completion events a framework relies on. Ranks are in-process engines
// (cluster.h). Built twice: test_engine_sim gives each rank its own
// simulated device, as each GPU process has its own GPU; test_engine_cuda
// (HVDTORCH_TEST_ON_CUDA, built with the CUDA device, run by make gpu-check)
// puts every rank on cuda:0 and exits 77 (skipped) where no GPU is visible.
// Values are small integers, exact in every dtype, and expected results are
// written out. The device ring is not here: it maps peers' memory, which a
// process cannot do for its own (CUDA IPC's rule, which the simulated device
// keeps), so it is turned off on CUDA (testConfig); tests/test_sim_device_mode.py
// runs it with one process per rank.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>

#include "algorithms/reducer_registry.h"
#include "check.h"
#include "cluster.h"
#include "common/error.h"
#include "device/reduce_kernels.h"
#include "device/sim_device.h"
#ifdef HVDTORCH_TEST_ON_CUDA
#include "device/cuda_device.h"
#endif
#include "dtype_values.h"
#include "ops/allgather.h"
#include "ops/allreduce.h"
#include "ops/alltoall.h"
#include "ops/broadcast.h"
#include "ops/join.h"
#include "ops/reducescatter.h"
#include "sim_tensors.h"
#include "submit.h"

using namespace hvdtorch;
using hvdtorch::test::Caller;
using hvdtorch::test::Cluster;

namespace {

const std::vector<DataType> kDtypes = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kBFloat16,
                                       DataType::kFloat16};

DeviceId simOf(int rank) { return DeviceId{DeviceKind::kSim, rank}; }

#ifdef HVDTORCH_TEST_ON_CUDA
const bool kCudaReady = [] {
  std::string why;
  if (cudaDeviceCount(&why) == 0) {
    std::printf("no GPU: %s; skipped\n", why.c_str());
    std::exit(77);
  }
  setDeviceMaker(DeviceKind::kCuda, [](int index) { return makeCudaDevice(index); });
  return true;
}();
// Every rank of this process is on cuda:0, and a process cannot open its own
// memory through CUDA IPC: no device ring (tests/test_gpu.py runs it).
Config testConfig() {
  Config c;
  c.device_ring = false;
  return c;
}
// The device rank `rank`'s tensors are on (several ranks share the one GPU).
DeviceId deviceOf(int /*rank*/) { return DeviceId{DeviceKind::kCuda, 0}; }
#else
DeviceId deviceOf(int rank) { return simOf(rank); }
Config testConfig() { return Config(); }
#endif

size_t numelOf(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// Host bytes of `shape` with element i = f(i).
template <typename F>
std::vector<char> hostValues(DataType dtype, const std::vector<int64_t>& shape, F f) {
  const size_t n = numelOf(shape);
  std::vector<char> bytes(n * dtypeSize(dtype));
  for (size_t i = 0; i < n; ++i) test::put(dtype, bytes.data(), i, f(i));
  return bytes;
}

double valueAt(DataType dtype, const std::vector<char>& bytes, size_t i) { return test::get(dtype, bytes.data(), i); }

std::string waitFor(Engine& eng, int64_t h) {
  auto st = eng.state(h);
  if (!st->waitFor(std::chrono::milliseconds(20000))) return "did not finish";
  return st->error();
}

OutputAllocator allocatorOn(Device& dev) {
  return [&dev](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
    return std::make_shared<DeviceTensor>(dev, dtype, shape);
  };
}

// Rank r's element i: (r + 1) + i % 7.
double input(int r, size_t i) { return (r + 1) + static_cast<double>(i % 7); }

// The backend's device collectives for in-process ranks, standing in for
// NCCL (NativeCollectives' *OnDevice calls): each rank's call copies its
// device input to registered host memory, waits until every rank has,
// combines all of them (a reduction in rank order, the root's data, the
// blocks concatenated, ...) and copies its part of the result back on its
// engine stream. It reduces Sum only, so other ops show the fallback.
class InProcDeviceCollectives {
 public:
  explicit InProcDeviceCollectives(int p) : p_(p), deposits_(p), sends_(p) {
    for (int r = 0; r < p; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
  }
  NativeCollectives* of(int rank) { return ranks_[rank].get(); }
  int calls() const { return calls_.load(); }

 private:
  using Deposits = std::vector<std::vector<char>>;
  // Every rank's input -> what `rank` receives.
  using Combine = std::function<std::vector<char>(const Deposits&, int rank)>;

  struct Rank : NativeCollectives {
    Rank(InProcDeviceCollectives& all, int rank) : all(all), rank(rank) {}
    bool supports(DataType, ReduceOp) const override { return false; }  // host memory: the ring instead
    void allreduce(void*, size_t, DataType, ReduceOp) override { throw InvalidArgument("not on host memory"); }
    void broadcast(void*, size_t, int) override { throw InvalidArgument("no broadcast here"); }
    void barrier() override { throw InvalidArgument("no barrier here"); }
    bool reducesOnDevice(Device&, DataType, ReduceOp op) override { return op == ReduceOp::kSum; }
    void allreduceOnDevice(Device& d, void* data, size_t count, DataType dtype, ReduceOp op) override {
      all.exchange(rank, d, data, data, count * dtypeSize(dtype),
                   [=](const Deposits& in, int) { return reduced(in, count, dtype, op); });
    }
    void reducescatterOnDevice(Device& d, const void* in, void* out, size_t block_count, DataType dtype,
                               ReduceOp op) override {
      const size_t block = block_count * dtypeSize(dtype);
      all.exchange(rank, d, in, out, block * all.p_, [=](const Deposits& in, int r) {
        const std::vector<char> sum = reduced(in, block_count * in.size(), dtype, op);
        return std::vector<char>(sum.begin() + block * r, sum.begin() + block * (r + 1));
      });
    }
    bool movesOnDevice(Device&) override { return true; }
    void broadcastOnDevice(Device& d, void* data, size_t bytes, int root) override {
      all.exchange(rank, d, data, data, bytes, [=](const Deposits& in, int) { return in[root]; });
    }
    void allgatherOnDevice(Device& d, const void* in, void* out, size_t block_bytes) override {
      all.exchange(rank, d, in, out, block_bytes, [](const Deposits& in, int) {
        std::vector<char> all;
        for (const auto& block : in) all.insert(all.end(), block.begin(), block.end());
        return all;
      });
    }
    void alltoallOnDevice(Device& d, const void* in, void* out, const std::vector<size_t>& send_bytes,
                          const std::vector<size_t>&) override {
      all.sends_[rank] = send_bytes;  // read by the others after exchange's first arrival
      size_t in_bytes = 0;
      for (size_t b : send_bytes) in_bytes += b;
      all.exchange(rank, d, in, out, in_bytes, [this](const Deposits& in, int r) {
        std::vector<char> mine;
        for (size_t s = 0; s < in.size(); ++s) {
          size_t at = 0;
          for (int q = 0; q < r; ++q) at += all.sends_[s][q];
          mine.insert(mine.end(), in[s].begin() + at, in[s].begin() + at + all.sends_[s][r]);
        }
        return mine;
      });
    }
    static std::vector<char> reduced(const Deposits& in, size_t count, DataType dtype, ReduceOp op) {
      std::vector<char> result(in[0]);
      for (size_t r = 1; r < in.size(); ++r) reduceInto(result.data(), in[r].data(), count, dtype, op);
      return result;
    }
    InProcDeviceCollectives& all;
    int rank;
  };

  void exchange(int rank, Device& d, const void* in, void* out, size_t in_bytes, const Combine& combine) {
    auto drained = d.newEvent();
    auto drain = [&] {
      d.record(*drained, nullptr);
      d.synchronize(*drained);
    };
    std::vector<char>& mine = deposits_[rank];
    mine.resize(in_bytes);
    d.registerHost(mine.data(), in_bytes);
    d.copyToHost(mine.data(), in, in_bytes, nullptr);
    drain();
    d.unregisterHost(mine.data());
    arrive();  // every rank's data is in
    std::vector<char> result = combine(deposits_, rank);
    arrive();  // every rank has read them
    d.registerHost(result.data(), result.size());
    d.copyFromHost(out, result.data(), result.size(), nullptr);
    drain();
    d.unregisterHost(result.data());
    ++calls_;
  }
  void arrive() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == p_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else if (!cv_.wait_for(lk, std::chrono::seconds(10), [&] { return generation_ != generation; })) {
      throw CollectiveError("in-process device collectives: a rank did not arrive within 10 s");
    }
  }

  int p_;
  Deposits deposits_;
  std::vector<std::vector<size_t>> sends_;  // all-to-all: each rank's bytes to each rank
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<int> calls_{0};
};

}  // namespace

TEST(allreduce_every_reducer_dtype_and_op_on_sim_tensors) {
  const int p = 3;
  Cluster c(p, testConfig());
  int ran = 0;
  for (const ReducerEntry& info : reducerRegistry()) {
    const std::string reducer = info.name;
    for (DataType dtype : kDtypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
        if (info.own_op) continue;  // adasum: its own test below
        std::vector<std::string> errors(p);
        std::vector<int> unavailable(p, 0);
        c.onEveryRank([&](int r, Engine& eng) {
          Caller caller(deviceOf(r));
          const std::vector<int64_t> shape{5, 3};
          auto t = caller.upload(dtype, shape, hostValues(dtype, shape, [&](size_t i) { return input(r, i); }));
          ops::AllreduceOptions o;
          o.name = strCat("ar.", reducer, ".", dtypeName(dtype), ".", static_cast<int>(op));
          o.inputs = {t};
          o.outputs = {t};
          o.op = op;
          o.reducer = reducer;
          int64_t h;
          try {
            h = ops::allreduce(eng, std::move(o));
          } catch (const InvalidArgument&) {
            unavailable[r] = 1;  // this reducer does not serve this dtype/op here (all ranks alike)
            return;
          }
          errors[r] = waitFor(eng, h);
          if (!errors[r].empty()) return;
          const auto got = caller.download(*eng.state(h), *t);
          for (size_t i = 0; i < numelOf(shape); ++i) {
            const double k = static_cast<double>(i % 7);
            const double want = op == ReduceOp::kSum ? 6 + 3 * k : op == ReduceOp::kAverage ? 2 + k : 3 + k;
            if (valueAt(dtype, got, i) != want) {
              errors[r] =
                  strCat(reducer, " ", dtypeName(dtype), " element ", i, ": ", valueAt(dtype, got, i), ", want ", want);
              break;
            }
          }
          eng.release(h);
        });
        for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
        CHECK(unavailable[0] == unavailable[1] && unavailable[1] == unavailable[2]);
        if (!unavailable[0]) ++ran;
      }
    }
  }
  // ring and central serve every dtype and op here.
  CHECK_MSG(ran >= 2 * 5 * 3, "only %d reducer/dtype/op combinations ran", ran);
}

TEST(one_rank_keeps_device_tensors_on_the_device) {
  // A job of one rank exchanges nothing: every reducer reduces device tensors
  // on the device (never staged through the host), in place or not, single or
  // fused, scales applied. Element i: (2 + i) * prescale 3 * postscale 0.5.
  Cluster c(1, testConfig());
  c.onEveryRank([&](int, Engine& eng) {
    Caller caller(deviceOf(0));
    int units = 0;
    const uint64_t before = ops::oneRankDeviceAllreduces();
    for (const ReducerEntry& info : reducerRegistry()) {
      if (info.name == std::string("native")) continue;  // asked for by name, it runs the backend (none here)
      for (bool in_place : {true, false}) {
        ops::AllreduceOptions o;
        o.name = strCat("alone.", info.name, ".", in_place);
        o.op = ReduceOp::kAverage;
        o.prescale = 3.0;
        o.postscale = 0.5;
        o.reducer = info.name;
        for (int64_t n : {4, 9}) {
          auto in = caller.upload(DataType::kFloat32, {n}, hostValues(DataType::kFloat32, {n}, [](size_t i) {
                                    return 2.0 + static_cast<double>(i);
                                  }));
          o.inputs.push_back(in);
          o.outputs.push_back(in_place ? in
                                       : std::make_shared<DeviceTensor>(deviceFor(deviceOf(0)), DataType::kFloat32,
                                                                        std::vector<int64_t>{n}));
        }
        const std::vector<TensorPtr> outs = o.outputs;
        int64_t h;
        try {
          h = ops::allreduce(eng, std::move(o));
        } catch (const InvalidArgument&) {
          continue;  // this reducer cannot run here (the node reducer without shared memory)
        }
        const std::string error = waitFor(eng, h);
        CHECK_MSG(error.empty(), "%s: %s", info.name, error.c_str());
        if (!error.empty()) continue;
        ++units;
        for (const auto& out : outs) {
          const auto got = caller.download(*eng.state(h), *out);
          for (int64_t i = 0; i < out->numel(); ++i) {
            const double want = (2.0 + static_cast<double>(i)) * 1.5;
            CHECK_MSG(valueAt(DataType::kFloat32, got, static_cast<size_t>(i)) == want, "%s in_place=%d [%lld]: %g",
                      info.name, in_place, static_cast<long long>(i), valueAt(DataType::kFloat32, got, i));
          }
        }
        eng.release(h);
      }
    }
    CHECK_MSG(units >= 4, "only %d one-rank all-reduces ran", units);
    // At least a unit per op (Adasum reduces each tensor of an op as a unit of its own).
    CHECK_MSG(ops::oneRankDeviceAllreduces() - before >= static_cast<uint64_t>(units),
              "%llu units stayed on the device for %d all-reduces at one rank",
              static_cast<unsigned long long>(ops::oneRankDeviceAllreduces() - before), units);
  });
}

TEST(staged_allreduce_runs_by_segments) {
  // A fused unit of three tensors staged through the host by segments of
  // 4 KiB (HVDTORCH_STAGING_SEGMENT_BYTES), boundaries falling inside the
  // tensors: 21110 floats, 21 segments. Each round's values differ from the
  // last, so a segment reduced before its copies landed, or copied back
  // from the wrong range, shows. Element i of tensor k on rank r, round q:
  // (r + 1) (q + 1) + (i + k) % 11; Average with prescale 2.
  const int p = 3;
  Config config = testConfig();
  config.staging_segment_bytes = 4096;
  config.device_ring = false;  // "ring" is the host ring here
  Cluster c(p, config);
  const std::vector<int64_t> sizes{10000, 3333, 7777};
  for (const std::string reducer : {"ring", "central"}) {
    for (int q = 0; q < 2; ++q) {
      std::vector<std::string> errors(p);
      c.onEveryRank([&](int r, Engine& eng) {
        Caller caller(deviceOf(r));
        auto value = [&](int rank, size_t k, size_t i) {
          return (rank + 1.0) * (q + 1.0) + static_cast<double>((i + k) % 11);
        };
        ops::AllreduceOptions o;
        o.name = strCat("segments.", reducer, ".", q);
        o.op = ReduceOp::kAverage;
        o.prescale = 2.0;
        o.reducer = reducer;
        for (size_t k = 0; k < sizes.size(); ++k)
          o.inputs.push_back(caller.upload(
              DataType::kFloat32, {sizes[k]},
              hostValues(DataType::kFloat32, {sizes[k]}, [&](size_t i) { return value(r, k, i); }), true));
        o.outputs = o.inputs;
        const std::vector<TensorPtr> outs = o.outputs;
        const int64_t h = ops::allreduce(eng, std::move(o));
        errors[r] = waitFor(eng, h);
        if (!errors[r].empty()) return;
        for (size_t k = 0; k < outs.size() && errors[r].empty(); ++k) {
          const auto got = caller.download(*eng.state(h), *outs[k]);
          for (int64_t i = 0; i < sizes[k]; ++i) {
            const double want = 2 * (value(0, k, i) + value(1, k, i) + value(2, k, i)) / 3;
            if (std::fabs(valueAt(DataType::kFloat32, got, i) - want) > 1e-4 * want) {
              errors[r] = strCat(reducer, " round ", q, " tensor ", k, " [", i,
                                 "]: ", valueAt(DataType::kFloat32, got, i), ", want ", want);
              break;
            }
          }
        }
        eng.release(h);
      });
      for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
    }
  }
}

TEST(grouped_allreduce_fuses_sim_tensors_with_scales) {
  // Tensor k, element i on rank r: (r + 1) * (k + 1) + i. Prescale 2,
  // Average over 3 ranks, postscale 5: 20 (k + 1) + 10 i.
  const int p = 3;
  Cluster c(p, testConfig());
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    Caller caller(deviceOf(r));
    ops::AllreduceOptions o;
    o.name = "group";
    o.op = ReduceOp::kAverage;
    o.prescale = 2.0;
    o.postscale = 5.0;
    const std::vector<int64_t> sizes{3, 5, 2, 7};
    for (size_t k = 0; k < sizes.size(); ++k)
      o.inputs.push_back(
          caller.upload(DataType::kFloat32, {sizes[k]}, hostValues(DataType::kFloat32, {sizes[k]}, [&](size_t i) {
                          return (r + 1) * (static_cast<double>(k) + 1) + static_cast<double>(i);
                        })));
    o.outputs = o.inputs;
    const std::vector<TensorPtr> outs = o.outputs;
    const int64_t h = ops::allreduce(eng, std::move(o));
    errors[r] = waitFor(eng, h);
    if (!errors[r].empty()) return;
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto got = caller.download(*eng.state(h), *outs[k]);
      for (int64_t i = 0; i < sizes[k]; ++i) {
        const double want = 20.0 * (static_cast<double>(k) + 1) + 10.0 * static_cast<double>(i);
        if (std::fabs(valueAt(DataType::kFloat32, got, i) - want) > 1e-4 * want)
          errors[r] = strCat("tensor ", k, " [", i, "]: ", valueAt(DataType::kFloat32, got, i), ", want ", want);
      }
    }
  });
  for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(adasum_on_sim_tensors) {
  // Every rank holds the same vector v: Adasum of equal vectors is v.
  const int p = 2;
  Cluster c(p, testConfig());
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    Caller caller(deviceOf(r));
    auto t =
        caller.upload(DataType::kFloat32, {6}, hostValues(DataType::kFloat32, {6}, [](size_t i) { return i + 1.0; }));
    ops::AllreduceOptions o;
    o.name = "adasum";
    o.inputs = {t};
    o.outputs = {t};
    o.op = ReduceOp::kAdasum;
    const int64_t h = ops::allreduce(eng, std::move(o));
    errors[r] = waitFor(eng, h);
    if (!errors[r].empty()) return;
    const auto got = caller.download(*eng.state(h), *t);
    for (size_t i = 0; i < 6; ++i)
      if (std::fabs(valueAt(DataType::kFloat32, got, i) - (i + 1.0)) > 1e-5)
        errors[r] = strCat("element ", i, ": ", valueAt(DataType::kFloat32, got, i));
  });
  for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(allgather_broadcast_alltoall_reducescatter_every_dtype_on_sim_tensors) {
  // Inputs uploaded late (sim_tensors.h): the executor's staging must wait on their ready events.
  const int p = 3;
  Cluster c(p, testConfig());
  for (DataType dtype : kDtypes) {
    std::vector<std::string> errors(p);
    c.onEveryRank([&](int r, Engine& eng) {
      Caller caller(deviceOf(r));
      auto fail = [&](const std::string& what) {
        if (errors[r].empty()) errors[r] = strCat(dtypeName(dtype), ": ", what);
      };
      // allgather: rank s gives s + 1 rows [s, 10 + s].
      {
        auto in = caller.upload(dtype, {r + 1, 2},
                                hostValues(dtype, {r + 1, 2}, [&](size_t i) { return i % 2 ? 10 + r : r; }), true);
        ops::AllgatherOptions o;
        o.name = "gather";
        o.inputs = {in};
        o.allocate = allocatorOn(caller.dev);
        const int64_t h = ops::allgather(eng, std::move(o));
        const std::string err = waitFor(eng, h);
        if (!err.empty()) return fail(err);
        auto out = eng.state(h)->outputs().at(0);
        const auto got = caller.download(*eng.state(h), *out);
        if (out->shape() != std::vector<int64_t>{6, 2}) fail("allgather shape");
        size_t row = 0;
        for (int s = 0; s < p; ++s)
          for (int k = 0; k <= s; ++k, ++row)
            if (valueAt(dtype, got, 2 * row) != s || valueAt(dtype, got, 2 * row + 1) != 10 + s)
              fail(strCat("allgather row ", row));
        eng.release(h);
      }
      // broadcast from rank 1, out of place.
      {
        auto in = caller.upload(dtype, {4}, hostValues(dtype, {4}, [&](size_t i) { return 3 * r + i; }), true);
        auto out = std::make_shared<DeviceTensor>(caller.dev, dtype, std::vector<int64_t>{4});
        ops::BroadcastOptions o;
        o.name = "bcast";
        o.input = in;
        o.output = out;
        o.root = 1;
        const int64_t h = ops::broadcast(eng, std::move(o));
        const std::string err = waitFor(eng, h);
        if (!err.empty()) return fail(err);
        const auto got = caller.download(*eng.state(h), *out);
        for (size_t i = 0; i < 4; ++i)
          if (valueAt(dtype, got, i) != 3 + i) fail(strCat("broadcast [", i, "]"));
        eng.release(h);
      }
      // alltoall: row j of rank r holds 10 r + j; rank r receives 10 s + r from each s.
      {
        auto in =
            caller.upload(dtype, {p, 2}, hostValues(dtype, {p, 2}, [&](size_t i) { return 10 * r + i / 2; }), true);
        ops::AlltoallOptions o;
        o.name = "a2a";
        o.input = in;
        o.allocate = allocatorOn(caller.dev);
        const int64_t h = ops::alltoall(eng, std::move(o));
        const std::string err = waitFor(eng, h);
        if (!err.empty()) return fail(err);
        const auto got = caller.download(*eng.state(h), *eng.state(h)->outputs().at(0));
        for (int s = 0; s < p; ++s)
          if (valueAt(dtype, got, 2 * s) != 10 * s + r || valueAt(dtype, got, 2 * s + 1) != 10 * s + r)
            fail(strCat("alltoall from rank ", s));
        // The received splits are host metadata, whatever the device.
        auto* received = dynamic_cast<HostTensor*>(eng.state(h)->outputs().at(1).get());
        if (!received || received->numel() != p) fail("alltoall: the received splits are not a host tensor of p");
        for (int s = 0; received && s < p; ++s)
          if (static_cast<const int64_t*>(received->data())[s] != 1) fail(strCat("alltoall: received from ", s));
        eng.release(h);
      }
      // reducescatter, Sum: 5 rows of (r + 1) (row + 1); rank r keeps its share, 6 (row + 1).
      {
        auto in = caller.upload(dtype, {5, 2},
                                hostValues(dtype, {5, 2}, [&](size_t i) { return (r + 1) * (i / 2 + 1.0); }), true);
        ops::ReducescatterOptions o;
        o.name = "rs";
        o.inputs = {in};
        o.op = ReduceOp::kSum;
        o.allocate = allocatorOn(caller.dev);
        const int64_t h = ops::reducescatter(eng, std::move(o));
        const std::string err = waitFor(eng, h);
        if (!err.empty()) return fail(err);
        auto out = eng.state(h)->outputs().at(0);
        const auto got = caller.download(*eng.state(h), *out);
        int64_t first = 0;
        for (int s = 0; s < r; ++s) first += ops::reducescatterRows(5, p, s);
        const int64_t rows = ops::reducescatterRows(5, p, r);
        if (out->shape() != std::vector<int64_t>{rows, 2}) fail("reducescatter shape");
        for (int64_t k = 0; k < rows; ++k)
          if (valueAt(dtype, got, 2 * k) != 6.0 * (first + k + 1)) fail(strCat("reducescatter row ", first + k));
        eng.release(h);
      }
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  }
}

TEST(host_and_device_tensors_of_one_op_across_ranks_is_an_error_naming_both) {
  const int p = 2;
  Cluster c(p, testConfig());
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    TensorPtr t;
    if (r == 0) {
      Caller caller(deviceOf(r));
      t = caller.upload(DataType::kFloat32, {4}, hostValues(DataType::kFloat32, {4}, [](size_t) { return 1.0; }));
    } else {
      t = std::make_shared<HostTensor>(DataType::kFloat32, std::vector<int64_t>{4});
    }
    errors[r] = test::finish(eng, test::sumOf(eng, "mixed", t));
  });
  for (int r = 0; r < p; ++r) {
    const std::string kind = deviceKindName(deviceOf(0).kind);
    CHECK_MSG(errors[r].find("device " + kind + " vs cpu") != std::string::npos ||
                  errors[r].find("device cpu vs " + kind) != std::string::npos,
              "rank %d: %s", r, errors[r].c_str());
  }
}

TEST(tensors_of_one_op_on_two_devices_are_refused_locally) {
  Cluster c(1);
  Caller a(simOf(0)), b(simOf(1));
  auto x = a.upload(DataType::kFloat32, {2}, hostValues(DataType::kFloat32, {2}, [](size_t) { return 1.0; }));
  auto y = b.upload(DataType::kFloat32, {2}, hostValues(DataType::kFloat32, {2}, [](size_t) { return 1.0; }));
  ops::AllreduceOptions o;
  o.name = "two.devices";
  o.inputs = {x};
  o.outputs = {y};
  std::string what;
  try {
    ops::allreduce(*c.engines[0], std::move(o));
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  CHECK_MSG(what.find("output 0 is on sim:1") != std::string::npos && what.find("sim:0") != std::string::npos &&
                what.find("'two.devices'") != std::string::npos,
            "%s", what.c_str());
}

TEST(a_joined_rank_stands_in_for_sim_tensors) {
  // Rank 1 joins; rank 0's Sum all-reduce and allgather run with its
  // stand-in (zeros, no rows), made on a simulated device like rank 0's.
  const int p = 2;
  Cluster c(p, testConfig());
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    Caller caller(deviceOf(r));
    if (r == 1) {
      ops::JoinOptions o;
      o.allocate = [](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
        return std::make_shared<HostTensor>(dtype, shape);
      };
      errors[r] = waitFor(eng, ops::join(eng, std::move(o)));
      return;
    }
    auto t =
        caller.upload(DataType::kFloat32, {3}, hostValues(DataType::kFloat32, {3}, [](size_t i) { return i + 1.0; }));
    const int64_t sum = test::sumOf(eng, "alone", t);
    const std::shared_ptr<OpState> summed = eng.state(sum);
    errors[r] = test::finish(eng, sum);
    if (!errors[r].empty()) return;
    ops::JoinOptions o;
    o.allocate = [](DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
      return std::make_shared<HostTensor>(dtype, shape);
    };
    const int64_t h = ops::join(eng, std::move(o));
    errors[r] = waitFor(eng, h);
    const auto got = caller.download(*summed, *t);
    for (size_t i = 0; i < 3; ++i)
      if (valueAt(DataType::kFloat32, got, i) != i + 1.0) errors[r] = strCat("element ", i);
  });
  for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
}

TEST(native_auto_and_broadcast_through_the_backends_device_collectives) {
  // `native` and `auto` (which prefers the backend where it serves; the
  // device ring would not apply here anyway) run Sum and Average through the
  // backend's device collectives, a lone tensor in its output and a fused
  // group through the device fusion buffer; Max, which the backend does not
  // take, is staged. Element i on rank r: (r + 1) + i % 7, with prescale 2.
  const int p = 3;
  InProcDeviceCollectives backend(p);
  Config config = testConfig();
  config.device_calibration_bytes = 0;  // `auto` by its rule (the calibration's own test is below)
  Cluster c(p, config, nullptr, [&](int r) { return backend.of(r); });
  int expected_calls = 0;
  for (const std::string reducer : {"native", "auto"}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
      for (int tensors : {1, 3}) {
        std::vector<std::string> errors(p);
        c.onEveryRank([&](int r, Engine& eng) {
          Caller caller(deviceOf(r));
          ops::AllreduceOptions o;
          const std::string name = strCat("dn.", reducer, ".", static_cast<int>(op), ".", tensors);
          o.name = name;
          o.op = op;
          o.prescale = 2.0;
          o.reducer = reducer;
          for (int k = 0; k < tensors; ++k)
            o.inputs.push_back(
                caller.upload(DataType::kFloat32, {11 + k},
                              hostValues(DataType::kFloat32, {11 + k}, [&](size_t i) { return input(r, i); }),
                              /*late=*/true));
          o.outputs = o.inputs;
          const std::vector<TensorPtr> outs = o.outputs;
          const int64_t h = ops::allreduce(eng, std::move(o));
          errors[r] = waitFor(eng, h);
          if (!errors[r].empty()) return;
          for (size_t k = 0; k < outs.size(); ++k) {
            const auto got = caller.download(*eng.state(h), *outs[k]);
            for (int64_t i = 0; i < 11 + static_cast<int64_t>(k); ++i) {
              const double m = static_cast<double>(i % 7);
              const double want = op == ReduceOp::kSum       ? 2 * (6 + 3 * m)
                                  : op == ReduceOp::kAverage ? 2 * (2 + m)
                                                             : 2 * (3 + m);
              if (valueAt(DataType::kFloat32, got, i) != want && errors[r].empty())
                errors[r] =
                    strCat(name, " tensor ", k, " [", i, "]: ", valueAt(DataType::kFloat32, got, i), ", want ", want);
            }
          }
          eng.release(h);
        });
        for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
        if (op != ReduceOp::kMax) expected_calls += p;  // one call per rank per unit
        CHECK_MSG(backend.calls() == expected_calls, "%s: %d device collective calls, want %d", reducer.c_str(),
                  backend.calls(), expected_calls);
      }
    }
  }
  // A broadcast from rank 1, its input uploaded late, into a separate output.
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    Caller caller(deviceOf(r));
    const std::vector<int64_t> shape{9};
    ops::BroadcastOptions o;
    o.name = "dn.broadcast";
    o.root = 1;
    // The output first: a pageable upload after the late input would make
    // the host wait for it (sim_tensors.h).
    o.output = caller.upload(DataType::kInt32, shape, hostValues(DataType::kInt32, shape, [](size_t) { return -1.0; }));
    o.input =
        caller.upload(DataType::kInt32, shape,
                      hostValues(DataType::kInt32, shape, [&](size_t i) { return 10.0 * r + static_cast<double>(i); }),
                      /*late=*/true);
    const TensorPtr out = o.output;
    const int64_t h = ops::broadcast(eng, std::move(o));
    errors[r] = waitFor(eng, h);
    if (!errors[r].empty()) return;
    const auto got = caller.download(*eng.state(h), *out);
    for (size_t i = 0; i < 9; ++i)
      if (valueAt(DataType::kInt32, got, i) != 10.0 + static_cast<double>(i) && errors[r].empty())
        errors[r] = strCat("broadcast [", i, "]: ", valueAt(DataType::kInt32, got, i), ", want ", 10 + i);
    eng.release(h);
  });
  for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  CHECK_MSG(backend.calls() == expected_calls + p, "broadcast: %d device collective calls, want %d", backend.calls(),
            expected_calls + p);
}

TEST(auto_calibrates_its_device_routes_once) {
  // Where more than one route applies (the backend's device collectives and
  // staging; the device ring does not apply in one process), the first
  // `auto` all-reduce times them at 4, 16 and 64 KiB (six runs of the
  // backend each, warm-up included) and the later ones reuse what it measured; each
  // takes one route, the same on every rank, and gives the right sums.
  const int p = 3;
  InProcDeviceCollectives backend(p);
  Config config = testConfig();
  config.device_calibration_bytes = 64 << 10;
  Cluster c(p, config, nullptr, [&](int r) { return backend.of(r); });
  const int calibrations = deviceCalibrations();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> errors(p);
    c.onEveryRank([&](int r, Engine& eng) {
      Caller caller(deviceOf(r));
      ops::AllreduceOptions o;
      o.name = strCat("calibrated.", round);
      o.op = ReduceOp::kSum;
      o.reducer = "auto";
      o.inputs = {caller.upload(DataType::kFloat32, {11},
                                hostValues(DataType::kFloat32, {11}, [&](size_t i) { return input(r, i); }), true)};
      o.outputs = o.inputs;
      const TensorPtr out = o.outputs[0];
      const int64_t h = ops::allreduce(eng, std::move(o));
      errors[r] = waitFor(eng, h);
      if (!errors[r].empty()) return;
      const auto got = caller.download(*eng.state(h), *out);
      for (size_t i = 0; i < 11; ++i)
        if (valueAt(DataType::kFloat32, got, i) != 6 + 3 * static_cast<double>(i % 7) && errors[r].empty())
          errors[r] = strCat("[", i, "]: ", valueAt(DataType::kFloat32, got, i));
      eng.release(h);
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "round %d, rank %d: %s", round, r, errors[r].c_str());
    CHECK_MSG(deviceCalibrations() == calibrations + p, "round %d: %d calibrations, want %d (one per rank)", round,
              deviceCalibrations() - calibrations, p);
  }
  const std::string described = lastDeviceCalibration();
  // The device ring does not apply; staging is timed through every host
  // reducer `auto` may run here, each named.
  CHECK_MSG(described.find("native") != std::string::npos && described.find("staged:ring") != std::string::npos &&
                described.find("staged:central") != std::string::npos &&
                described.find("; ring") == std::string::npos && described.find(": ring") == std::string::npos,
            "%s", described.c_str());
  CHECK_MSG(described.find("4 KiB, 16 KiB, 64 KiB:") != std::string::npos, "probes: %s", described.c_str());
  const int timed = 3 * 6 * p;  // three sizes, a warm-up and five repetitions, every rank
  CHECK_MSG(backend.calls() >= timed && backend.calls() <= timed + 2 * p, "%d device collective calls, want %d-%d",
            backend.calls(), timed, timed + 2 * p);
}

TEST(allgather_reducescatter_and_alltoall_through_the_backends_device_collectives) {
  // The backend's collectives take equal blocks only: ranks of unequal rows
  // go through padded blocks, one tensor of equal rows straight into its
  // output. Inputs land long after negotiation (kLongStall on the caller's
  // stream): only the op's wait on their ready events sees them. Outputs are
  // allocated on the device. Every op's tensors are kept to the end: freeing
  // simulated memory waits for every stream, as cudaFree does, and the
  // executor would otherwise free the last op's tensors before the next op,
  // waiting out the stall for it.
  constexpr int kLongStall = 100;
  const int p = 3;
  InProcDeviceCollectives backend(p);
  Cluster c(p, testConfig(), nullptr, [&](int r) { return backend.of(r); });
  std::vector<std::string> errors(p);
  auto fail = [&](int r, const std::string& what) {
    if (errors[r].empty()) errors[r] = what;
  };
  std::vector<std::vector<TensorPtr>> keep(p);
  auto keepAll = [&](int r, const OpState& state, const std::vector<TensorPtr>& inputs) {
    keep[r].insert(keep[r].end(), inputs.begin(), inputs.end());
    keep[r].insert(keep[r].end(), state.outputs().begin(), state.outputs().end());
  };
  // all-gather; value of rank s, tensor t, row i, column j: 1000 t + 100 s + 10 i + j.
  auto value = [](int t, int s, int64_t i, int64_t j) { return 1000.0 * t + 100.0 * s + 10.0 * i + j; };
  struct Gather {
    std::string name;
    std::vector<DataType> dtypes;  // one tensor each
    bool equal_rows;               // else rank s has s + 1 rows
  };
  for (const Gather& g :
       {Gather{"ag.equal", {DataType::kFloat32}, true}, Gather{"ag.uneven", {DataType::kInt32}, false},
        Gather{"ag.group", {DataType::kFloat32, DataType::kFloat64}, true}}) {
    c.onEveryRank([&](int r, Engine& eng) {
      Caller caller(deviceOf(r));
      caller.stall(kLongStall);
      auto rows = [&](int s) -> int64_t { return g.equal_rows ? 2 : s + 1; };
      ops::AllgatherOptions o;
      o.name = g.name;
      for (size_t t = 0; t < g.dtypes.size(); ++t) {
        const std::vector<int64_t> shape{rows(r), 3};
        o.inputs.push_back(caller.upload(
            g.dtypes[t], shape,
            hostValues(g.dtypes[t], shape, [&](size_t k) { return value(static_cast<int>(t), r, k / 3, k % 3); }),
            /*late=*/true));
      }
      o.allocate = allocatorOn(caller.dev);
      const std::vector<TensorPtr> inputs = o.inputs;
      const int64_t h = ops::allgather(eng, std::move(o));
      const std::string err = waitFor(eng, h);
      if (!err.empty()) return fail(r, strCat(g.name, ": ", err));
      keepAll(r, *eng.state(h), inputs);
      for (size_t t = 0; t < g.dtypes.size(); ++t) {
        const auto out = eng.state(h)->outputs().at(t);
        const auto got = caller.download(*eng.state(h), *out);
        size_t k = 0;
        for (int s = 0; s < p; ++s)
          for (int64_t i = 0; i < rows(s); ++i)
            for (int64_t j = 0; j < 3; ++j, ++k)
              if (valueAt(g.dtypes[t], got, k) != value(static_cast<int>(t), s, i, j))
                fail(r, strCat(g.name, " tensor ", t, " [", k, "]: ", valueAt(g.dtypes[t], got, k), ", want ",
                               value(static_cast<int>(t), s, i, j)));
      }
      eng.release(h);
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  }
  CHECK_MSG(backend.calls() == 3 * p, "all-gather: %d device collective calls, want %d", backend.calls(), 3 * p);

  // reduce-scatter of tensors of 7 and 4 rows (shares 3 2 2 and 2 1 1) of
  // 2 columns, element k of rank s being (s + 1) + k % 7: Average with
  // prescale 2 and postscale 3 through the backend; Max staged.
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kMax}) {
    c.onEveryRank([&](int r, Engine& eng) {
      Caller caller(deviceOf(r));
      caller.stall(kLongStall);
      ops::ReducescatterOptions o;
      o.name = strCat("rs.", static_cast<int>(op));
      o.op = op;
      o.prescale = 2.0;
      o.postscale = 3.0;
      const std::vector<int64_t> dims{7, 4};
      for (int64_t dim0 : dims)
        o.inputs.push_back(
            caller.upload(DataType::kFloat32, {dim0, 2},
                          hostValues(DataType::kFloat32, {dim0, 2}, [&](size_t k) { return input(r, k); }),
                          /*late=*/true));
      o.allocate = allocatorOn(caller.dev);
      const std::vector<TensorPtr> inputs = o.inputs;
      const int64_t h = ops::reducescatter(eng, std::move(o));
      const std::string err = waitFor(eng, h);
      if (!err.empty()) return fail(r, strCat("reducescatter: ", err));
      keepAll(r, *eng.state(h), inputs);
      for (size_t t = 0; t < dims.size(); ++t) {
        int64_t first = 0;
        for (int s = 0; s < r; ++s) first += ops::reducescatterRows(dims[t], p, s);
        const int64_t rows = ops::reducescatterRows(dims[t], p, r);
        const auto out = eng.state(h)->outputs().at(t);
        if (out->shape() != std::vector<int64_t>{rows, 2}) fail(r, strCat("reducescatter tensor ", t, " shape"));
        const auto got = caller.download(*eng.state(h), *out);
        for (int64_t k = 0; k < rows * 2; ++k) {
          const double m = static_cast<double>((first * 2 + k) % 7);
          const double want = op == ReduceOp::kAverage ? 3 * 2 * (2 + m) : 3 * 2 * (3 + m);
          if (valueAt(DataType::kFloat32, got, k) != want)
            fail(r, strCat("reducescatter ", static_cast<int>(op), " tensor ", t, " [", k,
                           "]: ", valueAt(DataType::kFloat32, got, k), ", want ", want));
        }
      }
      eng.release(h);
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  }
  CHECK_MSG(backend.calls() == 4 * p, "reduce-scatter: %d device collective calls, want %d", backend.calls(), 4 * p);

  // all-to-all: rank r sends (r + s) % 3 rows of 2 to rank s (rank 0 sends
  // itself none); row k to s holds 100 r + 10 s + k. Then one where no rank
  // sends a row: no collective at all.
  for (bool empty : {false, true}) {
    c.onEveryRank([&](int r, Engine& eng) {
      Caller caller(deviceOf(r));
      std::vector<int64_t> splits;
      std::vector<double> values;
      for (int s = 0; s < p; ++s) {
        splits.push_back(empty ? 0 : (r + s) % 3);
        for (int64_t k = 0; k < splits.back(); ++k) values.insert(values.end(), 2, 100.0 * r + 10.0 * s + k);
      }
      caller.stall(kLongStall);
      const int64_t rows = static_cast<int64_t>(values.size() / 2);
      ops::AlltoallOptions o;
      o.name = strCat("a2a.", empty);
      o.input = caller.upload(DataType::kFloat32, {rows, 2},
                              hostValues(DataType::kFloat32, {rows, 2}, [&](size_t k) { return values[k]; }),
                              /*late=*/true);
      o.splits = splits;
      o.allocate = allocatorOn(caller.dev);
      const std::vector<TensorPtr> inputs{o.input};
      const int64_t h = ops::alltoall(eng, std::move(o));
      const std::string err = waitFor(eng, h);
      if (!err.empty()) return fail(r, strCat("alltoall: ", err));
      keepAll(r, *eng.state(h), inputs);
      const auto got = caller.download(*eng.state(h), *eng.state(h)->outputs().at(0));
      const auto* received = static_cast<const int64_t*>(eng.state(h)->outputs().at(1)->data());
      size_t k = 0;
      for (int s = 0; s < p; ++s) {
        const int64_t from_s = empty ? 0 : (s + r) % 3;
        if (received[s] != from_s) fail(r, strCat("alltoall: ", received[s], " rows from ", s, ", want ", from_s));
        for (int64_t i = 0; i < from_s; ++i, k += 2)
          if (valueAt(DataType::kFloat32, got, k) != 100.0 * s + 10.0 * r + i)
            fail(r, strCat("alltoall: row ", i, " from ", s, ": ", valueAt(DataType::kFloat32, got, k)));
      }
      eng.release(h);
    });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  }
  CHECK_MSG(backend.calls() == 5 * p, "all-to-all: %d device collective calls, want %d", backend.calls(), 5 * p);
}

TEST(a_process_set_through_device_collectives_of_its_own) {
  // Set {0, 2} is given collectives over its two members (Engine::
  // addProcessSet): its device all-reduce and reduce-scatter go there, not
  // to the global set's. Element k of rank r: (r + 1) + k % 7.
  const int p = 3;
  InProcDeviceCollectives global(p), pair(2);
  Cluster c(p, testConfig(), nullptr, [&](int r) { return global.of(r); });
  std::vector<int32_t> ids(p);
  c.onEveryRank([&](int r, Engine& eng) { ids[r] = eng.addProcessSet({0, 2}, r == 1 ? nullptr : pair.of(r / 2)); });
  std::vector<std::string> errors(p);
  c.onEveryRank([&](int r, Engine& eng) {
    if (r == 1) return;
    Caller caller(deviceOf(r));
    auto fail = [&](const std::string& what) {
      if (errors[r].empty()) errors[r] = what;
    };
    const std::vector<int64_t> shape{6, 2};
    auto in = caller.upload(DataType::kFloat32, shape,
                            hostValues(DataType::kFloat32, shape, [&](size_t k) { return input(r, k); }), true);
    ops::AllreduceOptions a;
    a.name = "set.allreduce";
    a.op = ReduceOp::kSum;
    a.reducer = "native";
    a.process_set_id = ids[r];
    a.inputs = {in};
    a.outputs = {std::make_shared<DeviceTensor>(caller.dev, DataType::kFloat32, shape)};
    const TensorPtr out = a.outputs[0];
    int64_t h = ops::allreduce(eng, std::move(a));
    std::string err = waitFor(eng, h);
    if (!err.empty()) return fail(err);
    auto got = caller.download(*eng.state(h), *out);
    for (size_t k = 0; k < 12; ++k)
      if (valueAt(DataType::kFloat32, got, k) != 4 + 2 * static_cast<double>(k % 7))
        fail(strCat("allreduce [", k, "]: ", valueAt(DataType::kFloat32, got, k)));
    eng.release(h);
    ops::ReducescatterOptions rs;
    rs.name = "set.reducescatter";
    rs.op = ReduceOp::kSum;
    rs.process_set_id = ids[r];
    rs.inputs = {in};
    rs.allocate = allocatorOn(caller.dev);
    h = ops::reducescatter(eng, std::move(rs));
    err = waitFor(eng, h);
    if (!err.empty()) return fail(err);
    got = caller.download(*eng.state(h), *eng.state(h)->outputs().at(0));
    const size_t first = r == 0 ? 0 : 6;  // rank r / 2 of the set keeps rows [3 (r / 2), 3 (r / 2) + 3)
    for (size_t k = 0; k < 6; ++k)
      if (valueAt(DataType::kFloat32, got, k) != 4 + 2 * static_cast<double>((first + k) % 7))
        fail(strCat("reducescatter [", k, "]: ", valueAt(DataType::kFloat32, got, k)));
    eng.release(h);
  });
  for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
  CHECK_MSG(pair.calls() == 4 && global.calls() == 0, "set: %d calls to its collectives, %d to the global set's",
            pair.calls(), global.calls());
  c.onEveryRank([&](int r, Engine& eng) { eng.removeProcessSet(ids[r]); });
}

TEST(a_process_set_starts_from_the_global_sets_device_calibration) {
  // Set {0, 2} on one host, as the global set is: where the global set has
  // calibrated the device, the set's first `auto` all-reduce adopts that
  // model (an agreement, no timing); where the set runs first, it
  // calibrates on its own and the global set later does too. Element k of
  // rank r: (r + 1) + k % 7.
  const int p = 3;
  Config config = testConfig();
  config.device_calibration_bytes = 16 << 10;
  for (bool global_first : {true, false}) {
    InProcDeviceCollectives global(p), pair(2);
    Cluster c(p, config, nullptr, [&](int r) { return global.of(r); });
    std::vector<int32_t> ids(p);
    c.onEveryRank([&](int r, Engine& eng) { ids[r] = eng.addProcessSet({0, 2}, r == 1 ? nullptr : pair.of(r / 2)); });
    std::vector<std::string> errors(p);
    auto allreduce = [&](int r, Engine& eng, bool in_set) {
      if (in_set && r == 1) return;
      Caller caller(deviceOf(r));
      ops::AllreduceOptions o;
      o.name = in_set ? "set.auto" : "global.auto";
      o.op = ReduceOp::kSum;
      o.reducer = "auto";
      o.process_set_id = in_set ? ids[r] : 0;
      o.inputs = {caller.upload(DataType::kFloat32, {11},
                                hostValues(DataType::kFloat32, {11}, [&](size_t i) { return input(r, i); }), true)};
      o.outputs = o.inputs;
      const TensorPtr out = o.outputs[0];
      const int64_t h = ops::allreduce(eng, std::move(o));
      std::string err = waitFor(eng, h);
      if (err.empty()) {
        const auto got = caller.download(*eng.state(h), *out);
        const double base = in_set ? 4 : 6, ranks = in_set ? 2 : 3;
        for (size_t i = 0; i < 11 && err.empty(); ++i)
          if (valueAt(DataType::kFloat32, got, i) != base + ranks * static_cast<double>(i % 7))
            err = strCat("[", i, "]: ", valueAt(DataType::kFloat32, got, i));
      }
      eng.release(h);
      if (!err.empty() && errors[r].empty()) errors[r] = strCat(in_set ? "set: " : "global: ", err);
    };
    const int calibrations = deviceCalibrations(), adopted = deviceCalibrationsAdopted();
    for (bool in_set : {!global_first, global_first})
      c.onEveryRank([&](int r, Engine& eng) { allreduce(r, eng, in_set); });
    for (int r = 0; r < p; ++r) CHECK_MSG(errors[r].empty(), "rank %d: %s", r, errors[r].c_str());
    const int ran = deviceCalibrations() - calibrations, took = deviceCalibrationsAdopted() - adopted;
    CHECK_MSG(global_first ? ran == p && took == 2 : ran == p + 2 && took == 0,
              "global first %d: %d calibrations, %d adopted", global_first, ran, took);
    c.onEveryRank([&](int r, Engine& eng) { eng.removeProcessSet(ids[r]); });
  }
}

TEST(staging_copies_only_through_pinned_host_memory) {
  // Everything above ran in this process: every copy the engine made on a
  // simulated device's engine stream went through registered memory. (On
  // CUDA an unpinned copy is merely synchronous: nothing to count.)
  if (deviceOf(0).kind != DeviceKind::kSim) return;
  for (int r = 0; r < 3; ++r)
    CHECK_MSG(simUnpinnedEngineCopies(deviceFor(simOf(r))) == 0, "sim:%d: %llu unpinned copies", r,
              static_cast<unsigned long long>(simUnpinnedEngineCopies(deviceFor(simOf(r)))));
}

HVD_TEST_MAIN()
