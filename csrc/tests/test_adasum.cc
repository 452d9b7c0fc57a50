// The Adasum reducer against a reference written here: the pairwise rule
// applied up the same tree of ranks (a fold of the ranks past the largest
// power of two, then levels 1, 2, 4, ... with the lower ranks on the left),
// on whole vectors in double. Also its defining properties: orthogonal
// vectors add, equal vectors give themselves (their mean).
#include <cmath>
#include <vector>

#include "algorithms/adasum_allreduce.h"
#include "check.h"
#include "common/error.h"
#include "dtype_values.h"
#include "ranks.h"

using namespace hvdtorch;
using hvdtorch::test::get;
using hvdtorch::test::put;
using hvdtorch::test::runRanks;

namespace {

using Vec = std::vector<double>;

Vec pairRule(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa > 0 ? 1 - ab / (2 * aa) : 1, cb = bb > 0 ? 1 - ab / (2 * bb) : 1;
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

Vec referenceTree(std::vector<Vec> v) {
  const int p = static_cast<int>(v.size());
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;
  for (int r = pow2; r < p; ++r) v[r - pow2] = pairRule(v[r - pow2], v[r]);
  for (int d = 1; d < pow2; d *= 2)
    for (int i = 0; i < pow2; i += 2 * d) v[i] = pairRule(v[i], v[i + d]);
  return v[0];
}

// Rank r's input: different directions per rank, some negative components.
double input(int r, size_t i) { return std::sin(0.7 * r + 0.31 * i + 0.1) * (1 + r % 3) + 0.05 * r; }

double tolerance(DataType t) {
  return t == DataType::kFloat64 ? 1e-12 : t == DataType::kFloat32 ? 1e-5 : t == DataType::kFloat16 ? 5e-3 : 3e-2;
}

}  // namespace

TEST(adasum_matches_reference_tree) {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    for (size_t count : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(1001)}) {
      for (DataType dtype : {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16, DataType::kFloat16}) {
        // The reference starts from the values each rank actually holds (rounded to the dtype).
        std::vector<Vec> inputs(p, Vec(count));
        std::vector<char> tmp(8);
        for (int r = 0; r < p; ++r)
          for (size_t i = 0; i < count; ++i) {
            put(dtype, tmp.data(), 0, input(r, i));
            inputs[r][i] = get(dtype, tmp.data(), 0);
          }
        const Vec want = referenceTree(inputs);
        std::vector<std::vector<double>> got(p);
        runRanks(p, [&](Context& ctx) {
          AdasumAllreduce adasum;
          std::vector<char> buf(count * dtypeSize(dtype) + 1);
          for (size_t i = 0; i < count; ++i) put(dtype, buf.data(), i, input(ctx.rank(), i));
          adasum.allreduce(ctx, buf.data(), count, dtype, ReduceOp::kAdasum);
          for (size_t i = 0; i < count; ++i) got[ctx.rank()].push_back(get(dtype, buf.data(), i));
        });
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i)
          bad += std::fabs(got[0][i] - want[i]) > tolerance(dtype) * (1 + std::fabs(want[i]));
        CHECK_MSG(bad == 0, "p=%d count=%zu %s: %zu of %zu off the reference (first: %g vs %g)", p, count,
                  dtypeName(dtype), bad, count, count ? got[0][0] : 0.0, count ? want[0] : 0.0);
        for (int r = 1; r < p; ++r) CHECK_MSG(got[r] == got[0], "p=%d: rank %d differs from rank 0", p, r);
      }
    }
  }
}

TEST(adasum_of_orthogonal_vectors_is_their_sum_and_of_equal_ones_their_mean) {
  for (int p : {2, 4}) {
    runRanks(p, [p](Context& ctx) {
      AdasumAllreduce adasum;
      // Rank r holds e_r * (r + 1): pairwise orthogonal, so the sum of all.
      std::vector<double> v(p, 0.0);
      v[ctx.rank()] = ctx.rank() + 1.0;
      adasum.allreduce(ctx, v.data(), v.size(), DataType::kFloat64, ReduceOp::kAdasum);
      for (int i = 0; i < p; ++i) CHECK(v[i] == i + 1.0);
      // Every rank holds the same vector: the result is that vector.
      std::vector<double> same = {3.0, -1.5, 0.25};
      adasum.allreduce(ctx, same.data(), same.size(), DataType::kFloat64, ReduceOp::kAdasum);
      CHECK(same == (std::vector<double>{3.0, -1.5, 0.25}));
    });
  }
}

TEST(adasum_with_an_all_zero_vector_on_one_rank_is_finite_and_matches_reference) {
  // A rank whose gradient is all zero (a frozen or unused part of a model)
  // contributes nothing: its pair rule must not divide by its zero norm.
  for (int p : {2, 3, 4}) {
    for (int zero_rank = 0; zero_rank < p; ++zero_rank) {
      const size_t count = 5;
      std::vector<Vec> inputs(p, Vec(count));
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < count; ++i) inputs[r][i] = r == zero_rank ? 0.0 : input(r, i);
      const Vec want = referenceTree(inputs);
      std::vector<Vec> got(p);
      runRanks(p, [&](Context& ctx) {
        AdasumAllreduce adasum;
        Vec v = inputs[ctx.rank()];
        adasum.allreduce(ctx, v.data(), v.size(), DataType::kFloat64, ReduceOp::kAdasum);
        got[ctx.rank()] = v;
      });
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < count; ++i)
          CHECK_MSG(std::isfinite(got[r][i]) && std::fabs(got[r][i] - want[i]) <= 1e-12 * (1 + std::fabs(want[i])),
                    "p=%d zero on rank %d: rank %d element %zu is %g, want %g", p, zero_rank, r, i, got[r][i], want[i]);
    }
    // Every rank all zero: the result is zero, not NaN.
    runRanks(p, [](Context& ctx) {
      AdasumAllreduce adasum;
      Vec v(3, 0.0);
      adasum.allreduce(ctx, v.data(), v.size(), DataType::kFloat64, ReduceOp::kAdasum);
      CHECK(v == Vec(3, 0.0));
    });
  }
}

TEST(adasum_serves_only_adasum_on_floating_types) {
  runRanks(2, [](Context& ctx) {
    AdasumAllreduce adasum;
    CHECK(adasum.supports(ctx, DataType::kBFloat16, ReduceOp::kAdasum));
    CHECK(!adasum.supports(ctx, DataType::kInt32, ReduceOp::kAdasum));
    CHECK(!adasum.supports(ctx, DataType::kFloat32, ReduceOp::kSum));
    int32_t x = 1;
    CHECK_THROWS(adasum.allreduce(ctx, &x, 1, DataType::kInt32, ReduceOp::kAdasum), InvalidArgument);
  });
}

HVD_TEST_MAIN()
