#include "gradients/bucket_packing.h"

#include "common/error.h"

namespace hvdtorch {

BucketPacking packBucket(const std::vector<int64_t>& numels) {
  BucketPacking p;
  p.offsets.reserve(numels.size());
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] < 0)
      throw InvalidArgument(strCat("hvdtorch: parameter ", i, " of a bucket has ", numels[i], " elements"));
    p.offsets.push_back(p.numel);
    p.numel += numels[i];
  }
  return p;
}

}  // namespace hvdtorch
