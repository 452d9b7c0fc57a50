// Adasum (Maleki et al., MLSys 2021): adaptive summation of gradients. For
// two vectors a and b
//     adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b,
// which is a + b when they are orthogonal and their mean when they are
// equal. It is applied pairwise up a tree of ranks, by recursive halving and
// then doubling (the shape of Rabenseifner's all-reduce):
//  * level k = 1, 2, 4, ... (< p', the largest power of two <= p): rank r
//    pairs with r ^ k; the pair's common range of the vector is halved, the
//    lower rank keeping the first half, and each sends the other half to its
//    partner. Each rank now holds, for its half, the left subtree's vector a
//    (the lower ranks of the block of 2k ranks) and the right one's b;
//    the partial a.b, |a|^2, |b|^2 over the halves are summed over the
//    block's 2k ranks (recursive doubling), so every rank of the block uses
//    the same coefficients, and each combines its half.
//  * then the halves travel back (doubling) until every rank has the result.
//  * with p not a power of two, ranks p' .. p-1 first hand their vector to
//    rank r - p', which combines the two locally (the tree's first level),
//    and get the result back at the end.
// The result is bit-identical on every rank. Dot products and norms are
// accumulated in double; float16/bfloat16 are combined in float.
//
// Contract: as Reducer, for op Adasum only, on floating-point dtypes. Adasum
// is not associative: the tree above is the definition (lower ranks on the
// left at every level).
#pragma once

#include <vector>

#include "algorithms/reducer.h"

namespace hvdtorch {

class AdasumAllreduce : public Reducer {
 public:
  const char* name() const override { return "adasum"; }
  void allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) override;
  bool supports(const Context& ctx, DataType dtype, ReduceOp op) const override;

 private:
  std::vector<char> scratch_;  // the partner's half, grown on demand
};

// The two-vector rule over `count` elements in place in `a`, given the three
// dot products (a.b, a.a, b.b): a = ca * a + cb * b. Exposed for tests.
void adasumCombine(void* a, const void* b, size_t count, DataType dtype, double ab, double aa, double bb);
// {a.b, a.a, b.b} over `count` elements, in double.
std::vector<double> adasumDots(const void* a, const void* b, size_t count, DataType dtype);

}  // namespace hvdtorch
