// One round of the intra-host reduce-scatter through a node arena (the first
// step of the node reducer, and on one host the whole shared-memory
// reduce-scatter): every local rank copies its parts into its own slot, all
// wait for each other, then local rank j reduces part j of every local
// rank's slot into part j of its own slot. Every local rank reduces its own
// part in parallel; no single thread does the node's work.
//
// Contract:
//  * Every local rank calls it with the same `set`, part layout and dtype.
//  * On return, part `arena.localRank()` of this rank's slot in `set` holds
//    the reduction over the local ranks; the returned pointer addresses it.
//    Other local ranks read this slot until they have finished their own
//    reduction, so the caller must not write to `set` again before the next
//    barrier of the arena (alternating two sets between rounds does this).
//  * Parts must fit in the slot (at + count <= slot elements) and not overlap
//    there; a part may be empty.
#pragma once

#include <cstddef>
#include <vector>

#include "common/deadline.h"
#include "common/dtype.h"

namespace hvdtorch {

class ShmArena;

// Part j of a round, in elements: `count` elements at `from` in the caller's
// input, placed at `at` in the slot.
struct ArenaPart {
  size_t from;
  size_t at;
  size_t count;
};

char* arenaReduceScatter(ShmArena& arena, int set, const void* input, const std::vector<ArenaPart>& parts,
                         DataType dtype, ReduceOp op, Deadline deadline);

}  // namespace hvdtorch
