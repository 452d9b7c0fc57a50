// Byte serialisation for control messages. Every rank runs the same build, so
// plain memcpy of PODs is fine (no versioning, no byte swapping); strings and
// vectors are length-prefixed. A reader never trusts a length: a truncated or
// malformed message throws CollectiveError.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"

namespace hvdtorch {

class ByteWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "POD only");
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  template <typename T>
  void putVector(const std::vector<T>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) put(x);
  }
  std::vector<char>& bytes() { return buf_; }

 private:
  std::vector<char> buf_;
};

class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string getString() {
    const uint32_t n = get<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> getVector() {
    const uint32_t n = get<uint32_t>();
    need(static_cast<size_t>(n) * sizeof(T));  // before reserving: a corrupt length must not allocate
    std::vector<T> v;
    v.reserve(n);
    for (uint32_t i = 0; i < n; ++i) v.push_back(get<T>());
    return v;
  }
  bool done() const { return p_ == end_; }
  // A message is parsed whole: bytes left over mean it was not what we think.
  void expectEnd() const {
    if (!done()) throw CollectiveError("corrupt control message (trailing bytes)");
  }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) throw CollectiveError("corrupt control message (truncated)");
  }
  const char* p_;
  const char* end_;
};

// An enum stored as one byte, checked against its number of values.
template <typename E>
E getEnum(ByteReader& r, unsigned count, const char* what) {
  const auto v = r.get<uint8_t>();
  if (v >= count) throw CollectiveError(strCat("corrupt control message (", what, " ", unsigned(v), ")"));
  return static_cast<E>(v);
}

}  // namespace hvdtorch
