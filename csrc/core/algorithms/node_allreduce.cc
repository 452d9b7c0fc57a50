#include "algorithms/node_allreduce.h"

#include <algorithm>
#include <cstring>

#include "algorithms/arena_reduce_scatter.h"
#include "common/error.h"
#include "device/reduce_kernels.h"
#include "transport/shm/arena.h"
#include "transport/shm/registered_memory.h"

namespace hvdtorch {

NodeAllreduce::NodeAllreduce(NodeOptions opts) : opts_(std::move(opts)), ring_(opts_.ring) {}

NodeAllreduce::~NodeAllreduce() = default;

ShmArena& NodeAllreduce::arena(Context& ctx) {
  const Topology& t = ctx.topo();
  if (arena_) {
    if (arena_rank_ != t.rank || arena_->localSize() != t.local_size || arena_->localRank() != t.local_rank)
      throw InvalidArgument(strCat("rank ", t.rank,
                                   ": node reducer reused with a different topology; "
                                   "make one NodeAllreduce per Context"));
    return *arena_;
  }
  const std::string name = strCat(opts_.shm_prefix, "-n", t.host_of_rank[t.rank]);
  arena_ = std::make_unique<ShmArena>(name, t.local_rank, t.local_ranks, opts_.slot_bytes, ctx.deadline());
  arena_rank_ = t.rank;
  return *arena_;
}

void NodeAllreduce::checkUsable(const Context& ctx, DataType dtype, ReduceOp op, size_t min_slot_elems) const {
  if (!Reducer::supports(ctx, dtype, op))
    throw InvalidArgument(strCat("node reducer: op ", reduceOpName(op), " is not an element-wise reduction"));
  if (opts_.slot_bytes / dtypeSize(dtype) < min_slot_elems)
    throw InvalidArgument(strCat("node reducer: slot of ", opts_.slot_bytes, " bytes holds fewer than ", min_slot_elems,
                                 " ", dtypeName(dtype), " elements"));
  if (!broken_.empty()) throw CollectiveError(broken_);
}

template <typename Body>
void NodeAllreduce::guarded(Body&& body) {
  try {
    body();
  } catch (const InvalidArgument&) {
    throw;  // raised before anything was shared: the ranks are still in step
  } catch (const std::exception& e) {
    // Barrier counts no longer agree across local ranks. Releasing the arena
    // now makes the peers' waits fail fast instead of timing out.
    broken_ = strCat("node reducer unusable after an earlier failure: ", e.what());
    arena_.reset();
    throw;
  }
}

void NodeAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  allreduceInto(ctx, data, data, count, dtype, op);
}

void NodeAllreduce::allreduceInto(Context& ctx, const void* in, void* out, size_t count, DataType dtype, ReduceOp op) {
  const Topology& t = ctx.topo();
  const size_t esize = dtypeSize(dtype);
  if (count == 0) return;
  // Only the slots read `in`: the other paths reduce `out` in place.
  if (in != out && (t.size == 1 || !t.homogeneous() || t.local_size == 1)) std::memcpy(out, in, count * esize);
  if (t.size == 1) return;
  checkUsable(ctx, dtype, op, 1);
  if (!t.homogeneous()) {
    // Slices would not line up across hosts of different local_size.
    ring_.allreduce(ctx, out, count, dtype, op);
    return;
  }
  if (t.local_size == 1) {
    ring_.allreduceAmong(ctx, t.cross_ranks, out, count, dtype, op);
    return;
  }
  const size_t chunk = opts_.slot_bytes / esize;
  guarded([&] {
    const char* from = static_cast<const char*>(in);
    char* to = static_cast<char*>(out);
    for (size_t done = 0; done < count; done += chunk)
      reduceChunk(ctx, from + done * esize, to + done * esize, std::min(chunk, count - done), dtype, op);
  });
}

void NodeAllreduce::reduceChunk(Context& ctx, const char* in, char* data, size_t count, DataType dtype, ReduceOp op) {
  const Topology& t = ctx.topo();
  ShmArena& a = arena(ctx);
  const size_t esize = dtypeSize(dtype);
  const int me = t.local_rank;
  const int local = t.local_size;
  const int set = static_cast<int>(chunks_++ % 2);

  // 1. Publish where this chunk is: in a registered buffer, or copied into
  //    this rank's slot (the slot holds the chunk in its own layout).
  //    Out of place (in != data) the chunk is always copied: peers write
  //    results straight into a registered buffer, which must be the output.
  RegisteredRef where;
  const bool registered = in == data && opts_.registered && opts_.registered->find(data, count * esize, &where);
  a.source(me) = registered ? where : RegisteredRef{};
  if (registered) ++in_place_chunks_;
  if (!registered) std::memcpy(a.slot(set, me), in, count * esize);
  a.barrier(ctx.deadline(), "after copy-in");

  // The chunk of every local rank, wherever it lives.
  std::vector<char*> chunk_of(local);
  std::vector<bool> in_place(local);
  bool any_copied = false;
  for (int j = 0; j < local; ++j) {
    const RegisteredRef ref = a.source(j);
    in_place[j] = ref.id != 0;
    if (j == me) {
      chunk_of[j] = registered ? data : a.slot(set, me);
    } else if (in_place[j]) {
      if (!opts_.registered)
        throw CollectiveError(strCat("rank ", t.rank, ": local rank ", j,
                                     " reduces a registered buffer but this rank has no registered memory"));
      chunk_of[j] = opts_.registered->peerBuffer(ref, ctx.deadline()) + ref.offset;
    } else {
      chunk_of[j] = a.slot(set, j);
    }
    any_copied = any_copied || !in_place[j];
  }

  // 2. Local rank `me` reduces slice `me` of every chunk into its own chunk
  //    (the registered buffer itself, or its slot), then across hosts.
  const Range mine = evenSplit(count, local, me);
  const size_t at = mine.offset * esize;
  char* result = chunk_of[me] + at;
  for (int j = 0; j < local; ++j)
    if (j != me && mine.count > 0) reduceInto(result, chunk_of[j] + at, mine.count, dtype, op);
  if (t.cross_size > 1) ring_.allreduceAmong(ctx, t.cross_ranks, result, mine.count, dtype, op);

  // 3. Deliver: straight into every registered peer's buffer; into this
  //    rank's slot too when some rank copies its result out of the slots.
  for (int j = 0; j < local; ++j)
    if (j != me && in_place[j] && mine.count > 0) std::memcpy(chunk_of[j] + at, result, mine.count * esize);
  if (registered && any_copied && mine.count > 0) std::memcpy(a.slot(set, me) + at, result, mine.count * esize);
  a.barrier(ctx.deadline(), "after reduce");
  if (registered) return;
  for (int j = 0; j < local; ++j) {
    const Range r = evenSplit(count, local, j);
    std::memcpy(data + r.offset * esize, a.slot(set, j) + r.offset * esize, r.count * esize);
  }
}

std::map<std::string, int64_t> NodeAllreduce::settings() const {
  std::map<std::string, int64_t> s;
  for (const auto& [key, value] : ring_.settings()) s["ring_" + key] = value;
  s["slot_bytes"] = static_cast<int64_t>(opts_.slot_bytes);
  return s;
}

LinkTraffic NodeAllreduce::linkTraffic(const Context& ctx) const {
  const Topology& t = ctx.topo();
  if (!t.homogeneous()) return ring_.linkTraffic(ctx);
  LinkTraffic out = ringTraffic(t, t.cross_ranks);
  if (t.local_size > 1) out.messages_per_byte = out.messages / static_cast<double>(opts_.slot_bytes);
  return out;
}

bool NodeAllreduce::hasReduceScatter(const Context& ctx) const {
  const Topology& t = ctx.topo();
  return t.local_size > 1 && t.homogeneous();
}

void NodeAllreduce::reduceScatter(Context& ctx, void* data, const std::vector<size_t>& counts, DataType dtype,
                                  ReduceOp op) {
  const Topology& t = ctx.topo();
  if (!hasReduceScatter(ctx))
    throw InvalidArgument(
        strCat("rank ", t.rank, ": the node reduce-scatter needs hosts of as many ranks each, ", "more than one"));
  if (static_cast<int>(counts.size()) != t.size)
    throw InvalidArgument(strCat("rank ", t.rank, ": reduce-scatter needs one block size per rank"));
  checkUsable(ctx, dtype, op, static_cast<size_t>(t.local_size));
  const size_t esize = dtypeSize(dtype);
  const int local = t.local_size;
  const int me = t.local_rank;
  // Each round takes up to `per` elements of every block; block j's part
  // sits at j * per in the slot.
  const size_t per = opts_.slot_bytes / esize / local;
  const std::vector<size_t> offsets = blockOffsets(counts);
  const size_t rounds_span = *std::max_element(counts.begin(), counts.end());
  char* base = static_cast<char*>(data);
  // Column j: the ranks of local rank j, one per host, ascending (column
  // t.local_rank is t.cross_ranks).
  std::vector<std::vector<int>> column(local);
  for (int r = 0; r < t.size; ++r) column[t.local_rank_of[r]].push_back(r);
  guarded([&] {
    ShmArena& a = arena(ctx);
    std::vector<ArenaPart> parts(local);
    // 1. On the host: in round h local rank j reduces the host's sum of
    //    block column[j][h] (one round per host; one host: its own block).
    for (int h = 0; h < t.num_hosts; ++h) {
      for (size_t done = 0; done < rounds_span; done += per) {
        for (int j = 0; j < local; ++j) {
          const int owner = column[j][h];
          const size_t left = counts[owner] > done ? counts[owner] - done : 0;
          parts[j] = ArenaPart{offsets[owner] + done, j * per, std::min(per, left)};
        }
        const int set = static_cast<int>(chunks_++ % 2);
        const char* reduced = arenaReduceScatter(a, set, base, parts, dtype, op, ctx.deadline());
        std::memcpy(base + parts[me].from * esize, reduced, parts[me].count * esize);
      }
    }
  });
  if (t.num_hosts == 1) return;
  // 2. Across hosts: this rank's column, packed in ring order, reduce-
  //    scattered among the column's ranks (the ring's blocks tile a prefix).
  const std::vector<int>& mine = t.cross_ranks;
  std::vector<Range> blocks(mine.size());
  size_t total = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    blocks[i] = Range{total, counts[mine[i]]};
    total += counts[mine[i]];
  }
  if (total == 0) return;  // the same on every rank of the column: nothing to send
  if (scratch_.size() < total * esize) scratch_.resize(total * esize);
  for (size_t i = 0; i < mine.size(); ++i)
    std::memcpy(scratch_.data() + blocks[i].offset * esize, base + offsets[mine[i]] * esize, blocks[i].count * esize);
  ring_.reduceScatterAmong(ctx, mine, scratch_.data(), blocks, dtype, op);
  const Range& own = blocks[t.cross_rank];
  std::memcpy(base + offsets[t.rank] * esize, scratch_.data() + own.offset * esize, own.count * esize);
}

}  // namespace hvdtorch
