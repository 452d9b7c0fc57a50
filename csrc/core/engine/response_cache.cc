#include "engine/response_cache.h"

namespace hvdtorch {

int ResponseCache::idOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int>(it->second);
}

int ResponseCache::lookup(const Request& req) const {
  const int id = idOf(req.name);
  if (id < 0) return -1;
  return Request::signatureMismatch(entries_[id], req).empty() ? id : -1;
}

void ResponseCache::put(const Request& req) {
  if (!cacheable(req)) return;
  auto it = by_name_.find(req.name);
  if (it != by_name_.end()) {
    entries_[it->second] = req;  // same name, new signature: replace in place
    return;
  }
  if (entries_.size() >= capacity_) return;
  by_name_.emplace(req.name, static_cast<uint32_t>(entries_.size()));
  entries_.push_back(req);
}

}  // namespace hvdtorch
