// _C.HostGather (transport/shm/host_gather.h): the shared gathered buckets of
// shard=3 on one host, for hvdtorch/zero/gather_routes.py. Tensors go in
// as sources of a put and come out of await as views of the shared memory.
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/py_engine.h"
#include "common/error.h"
#include "transport/shm/host_gather.h"
#include "transport/shm/segment.h"

namespace py = pybind11;

namespace hvdtorch {

namespace {

// A HostGather and, per bucket, the storage of the tensor await() last gave
// out (weakly: the tensor's holders keep it alive, not this).
struct PyHostGather {
  std::shared_ptr<HostGather> gather;
  std::vector<std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>>> given;
};

// A HostGather for the ranks `ranks` (global, ascending) when they all live
// on this host with this rank among them, shared memory is on and there are
// at least two; None otherwise (the caller gathers through the engine).
std::shared_ptr<PyHostGather> makeHostGather(PyEngine& e, const std::string& name, const std::vector<int>& ranks,
                                             const std::vector<size_t>& bucket_bytes) {
  Engine& engine = *e.engine();
  const Topology& topo = engine.topo();
  if (!engine.config().shm || engine.shmToken().empty() || ranks.size() < 2) return nullptr;
  const auto me = std::find(ranks.begin(), ranks.end(), topo.rank);
  if (me == ranks.end()) return nullptr;
  for (int r : ranks)
    if (r < 0 || r >= topo.size || !topo.sameHost(r)) return nullptr;
  const std::string prefix = makeShmPrefix(engine.shmToken() + "z") + "-" + name;
  auto g = std::make_shared<PyHostGather>();
  g->gather = std::make_shared<HostGather>(prefix, static_cast<int>(me - ranks.begin()), ranks, bucket_bytes,
                                           engine.config().timeout);
  g->given.resize(bucket_bytes.size());
  return g;
}

// Bucket j's tensor, released. A tensor that still holds its memory (what a
// checkpointed forward's recomputation saved, a view kept by the user) is
// given a private copy first, under all its views at once (the storage's
// memory is swapped): its holders keep reading the values they had, while
// the slot goes to the host's next gather.
void release(PyHostGather& g, int j) {
  if (j < 0 || static_cast<size_t>(j) >= g.given.size())
    throw InvalidArgument(strCat("host gather: release of bucket ", j, " of ", g.given.size()));
  if (c10::intrusive_ptr<c10::StorageImpl> held = g.given[j] ? g.given[j]->lock() : nullptr) {
    const size_t bytes = held->nbytes();
    at::DataPtr copy = c10::GetCPUAllocator()->allocate(bytes);
    if (bytes > 0) std::memcpy(copy.get(), held->data(), bytes);
    held->set_data_ptr_noswap(std::move(copy));
  }
  g.given[j].reset();
  g.gather->release(j);
}

}  // namespace

void bindHostGather(py::module_& m) {
  py::class_<PyHostGather, std::shared_ptr<PyHostGather>>(m, "HostGather")
      // put(j, [(src, offset_elements), ...], wait): each src's bytes at that element offset of bucket j
      // (offsets in elements of the src's dtype).
      .def("put",
           [](PyHostGather& g, int j, const std::vector<std::pair<at::Tensor, int64_t>>& pieces, bool wait) {
             std::vector<HostGather::Piece> raw;
             for (const auto& [src, offset] : pieces) {
               if (!src.device().is_cpu() || !src.is_contiguous())
                 throw InvalidArgument("host gather: put takes contiguous CPU tensors");
               const size_t item = src.element_size();
               raw.push_back({src.data_ptr(), static_cast<size_t>(offset) * item, src.numel() * item});
             }
             py::gil_scoped_release unlocked;
             return g.gather->put(j, raw, wait);
           })
      // await_(j, numel, dtype): bucket j, gathered, as a 1-D tensor over the shared memory.
      .def("await_",
           [](PyHostGather& g, int j, int64_t numel, py::object dtype) {
             std::shared_ptr<char> memory;
             {
               py::gil_scoped_release unlocked;
               memory = g.gather->await(j);
             }
             const auto options =
                 at::TensorOptions().dtype(torch::python::detail::py_object_to_dtype(dtype)).device(at::kCPU);
             at::Tensor t = at::from_blob(memory.get(), {numel}, [memory](void*) mutable { memory.reset(); }, options);
             g.given[j] = t.storage().getWeakStorageImpl();
             return t;
           })
      // release(j): call once this rank's own references to the tensor are gone.
      .def("release", &release)
      .def("parties", [](PyHostGather& g) { return g.gather->parties(); })
      .def("generation", [](PyHostGather& g, int j) { return g.gather->generation(j); });
  m.def("host_gather", &makeHostGather, py::arg("engine"), py::arg("name"), py::arg("ranks"), py::arg("bucket_bytes"));
}

}  // namespace hvdtorch
