#include "engine/negotiation/response_cache.h"

#include "common/error.h"

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

void ResponseCache::touch(uint32_t id) {
  if (id >= where_.size()) throw InvalidArgument(strCat("response cache: no entry ", id));
  recency_.splice(recency_.end(), recency_, where_[id]);
}

void ResponseCache::put(const Request& req) {
  if (!cacheable(req) || capacity_ == 0) return;
  auto it = by_name_.find(req.name);
  if (it != by_name_.end()) {
    entries_[it->second] = req;  // same name, new signature: replace in place
    touch(it->second);
    return;
  }
  uint32_t id;
  if (entries_.size() < capacity_) {
    id = static_cast<uint32_t>(entries_.size());
    entries_.push_back(req);
    where_.push_back(recency_.insert(recency_.end(), id));
  } else {
    id = recency_.front();
    by_name_.erase(entries_[id].name);
    entries_[id] = req;
    touch(id);
  }
  by_name_.emplace(req.name, id);
}

}  // namespace hvdtorch
