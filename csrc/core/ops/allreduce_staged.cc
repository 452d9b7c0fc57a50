#include "ops/allreduce_staged.h"

#include <algorithm>

#include "device/devices.h"
#include "device/reduce_kernels.h"
#include "engine/execution/host_staging.h"

namespace hvdtorch::ops {

std::map<Device*, std::shared_ptr<Event>> reduceStaged(Executor& ex, const std::vector<StagedPart>& parts,
                                                       Reducer& reducer, DataType dtype, size_t count, ReduceOp op,
                                                       const StagedScaling& scaling,
                                                       const std::function<void(const std::string&, bool)>& mark) {
  const size_t esize = dtypeSize(dtype);
  const size_t segment_bytes = ex.options().staging_segment_bytes;
  const size_t seg = segment_bytes == 0 || op == ReduceOp::kAdasum ? count : std::max<size_t>(1, segment_bytes / esize);
  const size_t segments = std::max<size_t>(1, (count + seg - 1) / seg);
  char* fused = static_cast<char*>(ex.fusion().reserve(count * esize, parts.front().device));
  std::vector<Device*> devices;  // each device the parts are on, once
  for (const auto& p : parts)
    if (std::find(devices.begin(), devices.end(), p.device) == devices.end()) devices.push_back(p.device);
  // Calls f(part, first, last) for the elements [first, last) of the fused
  // buffer that a part holds within [lo, hi), from the first part ending
  // after lo (ends ascend): a segment visits only the parts it overlaps.
  auto forEachPart = [&](size_t lo, size_t hi, const std::function<void(const StagedPart&, size_t, size_t)>& f) {
    auto it = std::upper_bound(parts.begin(), parts.end(), lo, [](size_t v, const StagedPart& p) { return v < p.end; });
    for (; it != parts.end() && it->at < hi; ++it) {
      const size_t first = std::max(lo, it->at);
      const size_t last = std::min(hi, it->end);
      if (first < last) f(*it, first, last);
    }
  };

  mark("MEMCPY_IN_FUSION", true);
  // copied[s]: an event on each device that copies part of segment s.
  std::vector<std::vector<std::pair<Device*, std::shared_ptr<Event>>>> copied(segments);
  for (size_t s = 0; s < segments; ++s) {
    std::vector<Device*> used;
    forEachPart(s * seg, std::min(count, (s + 1) * seg), [&](const StagedPart& p, size_t first, size_t last) {
      const char* in = static_cast<const char*>(p.in);
      p.device->copyToHost(fused + first * esize, in + (first - p.at) * esize, (last - first) * esize, nullptr);
      if (std::find(used.begin(), used.end(), p.device) == used.end()) used.push_back(p.device);
    });
    for (Device* d : used) {
      copied[s].emplace_back(d, d->newEvent());
      d->record(*copied[s].back().second, nullptr);
    }
  }
  mark("MEMCPY_IN_FUSION", false);

  const std::string collective = strCat("ALLREDUCE:", reducer.name());
  mark(collective, true);
  for (size_t s = 0; s < segments; ++s) {
    const size_t lo = s * seg;
    const size_t n = std::min(count, lo + seg) - lo;
    char* data = fused + lo * esize;
    for (auto& [d, event] : copied[s]) d->synchronize(*event);
    copyScaled(data, data, n, dtype, scaling.prescale);
    if (ex.ctx().size() > 1)
      ex.router().reducers().allreduce(ex.ctx(), reducer, data, n, dtype, op);  // timed into `auto`'s model
    copyAveraged(data, data, n, dtype, scaling.divisor, scaling.postscale);
    forEachPart(lo, lo + n, [&](const StagedPart& p, size_t first, size_t last) {
      char* out = static_cast<char*>(p.out);
      p.device->copyFromHost(out + (first - p.at) * esize, fused + first * esize, (last - first) * esize, nullptr);
    });
  }
  mark(collective, false);
  // The fusion buffer is reused by the next unit: the copies must be done.
  mark("MEMCPY_OUT_FUSION", true);
  std::map<Device*, std::shared_ptr<Event>> done;
  for (Device* d : devices) done[d] = drainEngineStream(*d);
  mark("MEMCPY_OUT_FUSION", false);
  return done;
}

}  // namespace hvdtorch::ops
