#include "engine/execution/host_staging.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <set>

#include "common/error.h"
#include "device/devices.h"
#include "engine/execution/entry.h"

namespace hvdtorch {

namespace {
constexpr size_t kAlign = 64;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

// ---- HostPinning -------------------------------------------------------------

void HostPinning::pin(void* base, size_t bytes, Device& device) {
  if (device.id().kind == DeviceKind::kCpu || base == nullptr || bytes == 0) return;
  auto it = std::find_if(ranges_.begin(), ranges_.end(), [&](const Range& r) { return r.base == base; });
  if (it == ranges_.end()) {
    ranges_.push_back({base, {}});
    it = ranges_.end() - 1;
  }
  if (it->devices.count(device.id().kind) != 0) return;
  device.registerHost(base, bytes);
  it->devices[device.id().kind] = &device;
}

void HostPinning::unpinAll() {
  for (auto& r : ranges_)
    for (auto& [kind, device] : r.devices) device->unregisterHost(r.base);
  ranges_.clear();
}

// ---- StagingPool -------------------------------------------------------------

StagingPool::~StagingPool() { pinning_.unpinAll(); }  // before the chunks go

void StagingPool::addChunk(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, bytes) != 0) throw std::bad_alloc();
  chunks_.push_back({std::shared_ptr<void>(p, [](void* q) { std::free(q); }), bytes});
}

void* StagingPool::take(size_t bytes, Device& device) {
  const size_t want = aligned(std::max<size_t>(bytes, 1));
  while (current_ < chunks_.size() && chunks_[current_].size - used_ < want) {
    ++current_;
    used_ = 0;
  }
  if (current_ == chunks_.size()) {
    addChunk(std::max(want, total_ + want));
    used_ = 0;
  }
  Chunk& c = chunks_[current_];
  pinning_.pin(c.memory.get(), c.size, device);
  void* out = static_cast<char*>(c.memory.get()) + used_;
  used_ += want;
  total_ += want;
  return out;
}

void StagingPool::reset() {
  if (chunks_.size() > 1) {
    // Next time one chunk holds what this unit needed.
    const size_t total = std::max(total_, chunks_.back().size);
    pinning_.unpinAll();
    chunks_.clear();
    addChunk(total);
  }
  current_ = 0;
  used_ = 0;
  total_ = 0;
}

// ---- StagedTensor ------------------------------------------------------------

StagedTensor::StagedTensor(void* data, DataType dtype, std::vector<int64_t> shape)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), numel_(1) {
  for (int64_t d : shape_) numel_ *= d;
}

// ---- stream helpers ----------------------------------------------------------

void waitReady(Device& device, const std::vector<TensorPtr>& tensors) {
  std::set<Event*> seen;
  for (const auto& t : tensors) {
    const std::shared_ptr<Event> ev = t->ready();
    if (ev && seen.insert(ev.get()).second) device.wait(nullptr, *ev);
  }
}

// ---- StagedEntry -------------------------------------------------------------

// Outputs the op allocates while it runs: made on the device by the entry's
// own allocator, handed to the op as host stand-ins.
struct StagedAllocations {
  std::vector<std::pair<const TensorBuffer*, TensorPtr>> made;  // host stand-in -> device output
};

std::unique_ptr<StagedEntry> StagedEntry::stageIn(Entry& e, StagingPool& pool) {
  const TensorPtr& first = !e.inputs.empty() ? e.inputs.front() : e.outputs.front();
  Device& dev = deviceFor(first->device());
  std::unique_ptr<StagedEntry> s(new StagedEntry(dev));
  waitReady(dev, e.inputs);
  waitReady(dev, e.outputs);

  std::vector<TensorPtr> host_inputs;
  for (const auto& in : e.inputs) {
    auto host = std::make_shared<StagedTensor>(pool.take(in->bytes(), dev), in->dtype(), in->shape());
    dev.copyToHost(host->data(), in->data(), in->bytes(), nullptr);
    host_inputs.push_back(std::move(host));
  }
  std::vector<TensorPtr> host_outputs;
  for (const auto& out : e.outputs) {
    TensorPtr host;
    for (size_t i = 0; i < e.inputs.size() && !host; ++i)
      if (e.inputs[i]->data() == out->data()) host = host_inputs[i];  // in place: one copy serves both
    if (!host) host = std::make_shared<StagedTensor>(pool.take(out->bytes(), dev), out->dtype(), out->shape());
    s->outputs_.emplace_back(host.get(), out);
    host_outputs.push_back(std::move(host));
  }
  if (e.allocate) {
    s->allocated_ = std::make_shared<StagedAllocations>();
    e.allocate = [made = s->allocated_, on_device = std::move(e.allocate), &pool, &dev](
                     DataType dtype, const std::vector<int64_t>& shape) -> TensorPtr {
      TensorPtr out = on_device(dtype, shape);
      auto host = std::make_shared<StagedTensor>(pool.take(out->bytes(), dev), dtype, shape);
      made->made.emplace_back(host.get(), std::move(out));
      return host;
    };
  }
  drainEngineStream(dev);  // the reducers read the host copies next
  s->device_inputs_ = std::exchange(e.inputs, std::move(host_inputs));
  s->device_outputs_ = std::exchange(e.outputs, std::move(host_outputs));
  return s;
}

void StagedEntry::stageOut(Entry& e) {
  if (allocated_) outputs_.insert(outputs_.end(), allocated_->made.begin(), allocated_->made.end());
  // e.outputs now holds host stand-ins (given ones, or allocated ones the op
  // published there); map each back to its device tensor.
  std::vector<TensorPtr> device_outputs;
  for (const auto& host : e.outputs) {
    if (dynamic_cast<const HostTensor*>(host.get())) {
      device_outputs.push_back(host);  // host metadata the op made (alltoall's received splits): stays there
      continue;
    }
    auto it = std::find_if(outputs_.begin(), outputs_.end(), [&](const auto& p) { return p.first == host.get(); });
    if (it == outputs_.end())
      throw CollectiveError(
          strCat(e.request.describe(), ": an output of the op was not staged for ", device_.id().str()));
    TensorBuffer& dst = *it->second;
    device_.copyFromHost(dst.data(), host->data(), dst.bytes(), nullptr);
    device_outputs.push_back(it->second);
  }
  e.state->completion = drainEngineStream(device_);
  e.state->device = device_.id();
  e.inputs = std::move(device_inputs_);
  e.outputs = std::move(device_outputs);
  if (allocated_) allocated_.reset();
}

}  // namespace hvdtorch
