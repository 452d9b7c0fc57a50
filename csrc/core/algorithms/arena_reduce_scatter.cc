#include "algorithms/arena_reduce_scatter.h"

#include <cstring>

#include "device/reduce_kernels.h"
#include "transport/shm/arena.h"

namespace hvdtorch {

char* arenaReduceScatter(ShmArena& arena, int set, const void* input, const std::vector<ArenaPart>& parts,
                         DataType dtype, ReduceOp op, Deadline deadline) {
  const size_t esize = dtypeSize(dtype);
  const int me = arena.localRank();
  char* mine = arena.slot(set, me);
  const char* in = static_cast<const char*>(input);
  for (const ArenaPart& part : parts)
    if (part.count > 0) std::memcpy(mine + part.at * esize, in + part.from * esize, part.count * esize);
  arena.barrier(deadline, "after copy-in");
  const ArenaPart& own = parts[me];
  char* result = mine + own.at * esize;
  for (int j = 0; j < arena.localSize(); ++j)
    if (j != me && own.count > 0) reduceInto(result, arena.slot(set, j) + own.at * esize, own.count, dtype, op);
  return result;
}

}  // namespace hvdtorch
