#include "algorithms/adasum_allreduce.h"

#include <cstring>

#include "common/error.h"
#include "device/reduce_kernels.h"

namespace hvdtorch {

namespace {

// Element i of a floating-point buffer, widened to double, and back.
double load(const void* p, size_t i, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: return halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    default: throw InvalidArgument(strCat("adasum: dtype ", dtypeName(dtype), " is not floating point"));
  }
}

void store(void* p, size_t i, DataType dtype, double v) {
  switch (dtype) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; return;
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = floatToHalf(static_cast<float>(v)); return;
    case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = floatToBf16(static_cast<float>(v)); return;
    default: throw InvalidArgument(strCat("adasum: dtype ", dtypeName(dtype), " is not floating point"));
  }
}

double coefficient(double ab, double self) { return self > 0 ? 1.0 - ab / (2.0 * self) : 1.0; }

// Sends and receives with one peer at once, receive posted first; empty
// transfers are skipped (both sides know the sizes).
void exchange(Link& link, void* in, size_t in_bytes, const void* out, size_t out_bytes, Deadline deadline) {
  std::unique_ptr<LinkRequest> r, s;
  if (in_bytes > 0) r = link.irecv(in, in_bytes);
  if (out_bytes > 0) s = link.isend(out, out_bytes);
  if (r) r->wait(deadline);
  if (s) s->wait(deadline);
}

}  // namespace

std::vector<double> adasumDots(const void* a, const void* b, size_t count, DataType dtype) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < count; ++i) {
    const double x = load(a, i, dtype), y = load(b, i, dtype);
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return {ab, aa, bb};
}

void adasumCombine(void* a, const void* b, size_t count, DataType dtype, double ab, double aa, double bb) {
  const double ca = coefficient(ab, aa), cb = coefficient(ab, bb);
  for (size_t i = 0; i < count; ++i) store(a, i, dtype, ca * load(a, i, dtype) + cb * load(b, i, dtype));
}

bool AdasumAllreduce::supports(const Context&, DataType dtype, ReduceOp op) const {
  return op == ReduceOp::kAdasum && isFloating(dtype);
}

void AdasumAllreduce::allreduce(Context& ctx, void* data, size_t count, DataType dtype, ReduceOp op) {
  if (!supports(ctx, dtype, op))
    throw InvalidArgument(strCat("adasum reducer: op ", reduceOpName(op), " on ", dtypeName(dtype),
                                 " (it serves Adasum on floating-point tensors)"));
  const int p = ctx.size();
  const int me = ctx.rank();
  if (p <= 1 || count == 0) return;
  const size_t esize = dtypeSize(dtype);
  char* base = static_cast<char*>(data);
  if (scratch_.size() < count * esize) scratch_.resize(count * esize);
  char* other = scratch_.data();
  const Deadline deadline = ctx.deadline();
  int pow2 = 1;
  while (pow2 * 2 <= p) pow2 *= 2;

  // Fold: ranks past the largest power of two hand their vector over.
  if (me >= pow2) {
    Link& partner = ctx.link(me - pow2);
    partner.send(base, count * esize, deadline);
    partner.recv(base, count * esize, deadline);
    return;
  }
  if (me + pow2 < p) {
    ctx.link(me + pow2).recv(other, count * esize, deadline);
    const std::vector<double> d = adasumDots(base, other, count, dtype);
    adasumCombine(base, other, count, dtype, d[0], d[1], d[2]);
  }

  // Halving: at each level keep one half of the common range.
  std::vector<Range> kept;  // my range before each level's split
  Range range{0, count};
  for (int level = 1; level < pow2; level <<= 1) {
    kept.push_back(range);
    const int peer = me ^ level;
    const bool left = (me & level) == 0;
    const size_t half = range.count / 2;
    const Range mine = left ? Range{range.offset, half} : Range{range.offset + half, range.count - half};
    const Range theirs = left ? Range{range.offset + half, range.count - half} : Range{range.offset, half};
    // Receive the partner's copy of the half I keep, send mine of the other.
    exchange(ctx.link(peer), other, mine.count * esize, base + theirs.offset * esize, theirs.count * esize, deadline);
    // a is the left subtree's vector: mine when I am the left rank.
    char* own = base + mine.offset * esize;
    std::vector<double> d = left ? adasumDots(own, other, mine.count, dtype)
                                 : adasumDots(other, own, mine.count, dtype);
    // Sum the partial products over the block of 2*level ranks holding the
    // rest of both vectors (recursive doubling: a + b == b + a, so every
    // rank ends with the same bits).
    for (int k = 1; k < 2 * level; k <<= 1) {
      double partial[3];
      exchange(ctx.link(me ^ k), partial, sizeof partial, d.data(), sizeof partial, deadline);
      for (int i = 0; i < 3; ++i) d[i] += partial[i];
    }
    if (left) {
      adasumCombine(own, other, mine.count, dtype, d[0], d[1], d[2]);
    } else {
      // own = ca * a + cb * b with a the partner's half: combine into the
      // scratch copy of a, then move it into place.
      adasumCombine(other, own, mine.count, dtype, d[0], d[1], d[2]);
      std::memcpy(own, other, mine.count * esize);
    }
    range = mine;
  }

  // Doubling: give back my half, take the partner's, level by level.
  for (int level = pow2 >> 1; level >= 1; level >>= 1) {
    const Range whole = kept.back();
    kept.pop_back();
    const bool left = (me & level) == 0;
    const Range theirs = left ? Range{whole.offset + range.count, whole.count - range.count}
                              : Range{whole.offset, whole.count - range.count};
    exchange(ctx.link(me ^ level), base + theirs.offset * esize, theirs.count * esize, base + range.offset * esize,
             range.count * esize, deadline);
    range = whole;
  }
  if (me + pow2 < p) ctx.link(me + pow2).send(base, count * esize, deadline);
}

}  // namespace hvdtorch
