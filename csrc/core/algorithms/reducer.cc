#include "algorithms/reducer.h"

#include "common/error.h"

namespace hvdtorch {

ReducerKind parseReducerKind(const std::string& name) {
  if (name == "auto" || name.empty()) return ReducerKind::kAuto;
  if (name == "ring") return ReducerKind::kRing;
  if (name == "node") return ReducerKind::kNode;
  if (name == "central") return ReducerKind::kCentral;
  if (name == "native") return ReducerKind::kNative;
  throw InvalidArgument(strCat("unknown reducer '", name,
                               "': expected one of auto, ring, node, central, native"));
}

const char* reducerKindName(ReducerKind kind) {
  switch (kind) {
    case ReducerKind::kAuto: return "auto";
    case ReducerKind::kRing: return "ring";
    case ReducerKind::kNode: return "node";
    case ReducerKind::kCentral: return "central";
    case ReducerKind::kNative: return "native";
  }
  return "unknown";
}

Range evenSplit(size_t count, size_t parts, size_t index) {
  const size_t base = count / parts;
  const size_t extra = count % parts;
  const size_t offset = index * base + (index < extra ? index : extra);
  return Range{offset, base + (index < extra ? 1 : 0)};
}

}  // namespace hvdtorch
