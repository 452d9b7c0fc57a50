#include "engine/process_set.h"

#include <sstream>

namespace hvdtorch {

std::string ProcessSet::describe() const {
  std::ostringstream os;
  os << "process set " << id << " [";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

}  // namespace hvdtorch
