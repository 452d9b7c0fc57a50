#include "engine/negotiation/fusion_plan.h"

#include "engine/op_spec.h"

namespace hvdtorch {

namespace {

bool fusable(const Request& a, size_t ta, const Request& b, size_t tb) {
  const ReduceArgs& x = a.payload<ReduceArgs>();
  const ReduceArgs& y = b.payload<ReduceArgs>();
  return x.fuse && y.fuse && a.tensors[ta].dtype == b.tensors[tb].dtype &&
         a.tensors[ta].device == b.tensors[tb].device && x.op == y.op && x.prescale == y.prescale &&
         x.postscale == y.postscale && x.reducer == y.reducer;
}

}  // namespace

std::vector<WorkUnit> planWork(std::vector<ReadyOp>& ready, size_t fusion_threshold) {
  std::vector<WorkUnit> units;
  // Index of the all-reduce unit still accepting pieces (an index, not a
  // pointer: `units` reallocates as it grows).
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t open = kNone;
  for (ReadyOp& op : ready) {
    if (!op.entry) continue;  // an error for an op this rank never submitted
    const OpSpec* spec = op.response.error.empty() ? &opSpec(op.response.type) : nullptr;
    if (!spec || !spec->fuses) {
      WorkUnit u;
      u.type = op.response.type;
      u.spec = spec;
      u.error = op.response.error;
      u.plan = std::move(op.response.plan);
      u.pieces.push_back({op.entry, 0});
      units.push_back(std::move(u));
      open = kNone;
      continue;
    }
    const Request& req = op.entry->request;
    op.entry->pieces_left = static_cast<int>(req.tensors.size());
    for (size_t t = 0; t < req.tensors.size(); ++t) {
      const size_t bytes = static_cast<size_t>(req.tensors[t].numel()) * dtypeSize(req.tensors[t].dtype);
      bool fits = false;
      if (open != kNone) {
        const WorkUnit::Piece& first = units[open].pieces.front();
        fits = units[open].bytes + bytes <= fusion_threshold && fusable(first.entry->request, first.tensor, req, t);
      }
      if (!fits) {
        units.emplace_back();
        units.back().type = op.response.type;
        units.back().spec = spec;
        open = units.size() - 1;
      }
      units[open].pieces.push_back({op.entry, t});
      units[open].bytes += bytes;
    }
  }
  return units;
}

}  // namespace hvdtorch
