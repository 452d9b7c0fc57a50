// The response cache (Horovod's design, Romero et al. NSDI'22): once an
// operation has been negotiated, every rank remembers its signature under a
// small integer id. Next time, a rank reports it with one bit instead of a
// serialized request, and the coordinator finds what is ready everywhere with
// an AND over the ranks' bit vectors.
//
// Every rank holds an identical copy: the cache is only ever changed by
// touch() and put() calls made in response-list order, which is the same on
// every rank. When full, put() evicts the least recently used entry (used:
// put, or touched because it ran from the cache) and gives its id to the new
// signature; since every rank sees the same calls in the same order, every
// rank evicts the same entry. A rank that had reported the evicted op by its
// bit sends it in full in its next message (the engine checks, for each op
// pending by bit, that its name still holds that id).
#pragma once

#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace hvdtorch {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }

  // Ops whose plan follows from the signature alone (every rank's request
  // is the cached one): their op table row says so. Allgather and alltoall
  // plans depend on per-rank sizes, so they are negotiated in full every time.
  static bool cacheable(const Request& req) { return opSpec(req.type).cacheable; }
  // Id of a cached request with this name and an identical signature, or -1.
  int lookup(const Request& req) const;
  // Id cached under `name` (whatever its signature), or -1.
  int idOf(const std::string& name) const;
  const Request& at(uint32_t id) const { return entries_.at(id); }
  size_t size() const { return entries_.size(); }
  size_t words() const { return (entries_.size() + 63) / 64; }

  // Caches `req` (if cacheable) under its name, as the most recently used
  // entry. Full: evicts the least recently used entry first and reuses its id.
  void put(const Request& req);
  // Marks entry `id` as just used (it ran from the cache).
  void touch(uint32_t id);
  // Ids from the least to the most recently used (for tests and diagnostics).
  std::vector<uint32_t> lruOrder() const { return {recency_.begin(), recency_.end()}; }

 private:
  size_t capacity_;
  std::vector<Request> entries_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::list<uint32_t> recency_;                       // front: least recently used
  std::vector<std::list<uint32_t>::iterator> where_;  // id -> its place in recency_
};

}  // namespace hvdtorch
