#include "algorithms/device_routes.h"

#include <algorithm>
#include <cstdio>

#include "algorithms/reducer_registry.h"
#include "common/error.h"

namespace hvdtorch {

const char* deviceRouteName(DeviceRoute route) {
  switch (route) {
    case DeviceRoute::kNative: return "native";
    case DeviceRoute::kRing: return "ring";
    case DeviceRoute::kStaged: return "staged";
  }
  return "?";
}

DeviceRouteModel::DeviceRouteModel(std::vector<size_t> sizes, std::vector<Timed> ways)
    : sizes_(std::move(sizes)), ways_(std::move(ways)) {
  if (sizes_.empty() || !std::is_sorted(sizes_.begin(), sizes_.end()) || sizes_.front() == 0)
    throw InvalidArgument("device route model: probe sizes must be positive and ascending");
  for (const Timed& t : ways_)
    if (t.seconds.size() != sizes_.size()) throw InvalidArgument("device route model: one time per probe size");
}

double DeviceRouteModel::estimate(const Timed& timed, size_t bytes) const {
  const std::vector<double>& t = timed.seconds;
  for (double v : t)
    if (v < 0) return -1.0;
  const auto b = static_cast<double>(bytes);
  if (bytes <= sizes_.front()) return t.front();
  if (bytes >= sizes_.back()) return t.back() * b / static_cast<double>(sizes_.back());
  const size_t hi = static_cast<size_t>(std::upper_bound(sizes_.begin(), sizes_.end(), bytes) - sizes_.begin());
  const double x0 = static_cast<double>(sizes_[hi - 1]), x1 = static_cast<double>(sizes_[hi]);
  return t[hi - 1] + (t[hi] - t[hi - 1]) * (b - x0) / (x1 - x0);
}

double DeviceRouteModel::estimate(const DeviceWay& way, size_t bytes) const {
  for (const Timed& t : ways_)
    if (t.way == way) return estimate(t, bytes);
  return -1.0;
}

DeviceWay DeviceRouteModel::choose(size_t bytes, const std::function<bool(const DeviceWay&)>& serves,
                                   DeviceRoute rule) const {
  // The incumbent: the rule's route on its fastest measured way; the
  // challenger: the fastest measured way of all.
  DeviceWay incumbent{rule, kAutoReducer}, best{};
  double incumbent_t = -1.0, best_t = -1.0;
  for (const Timed& t : ways_) {
    if (!serves(t.way)) continue;
    const double s = estimate(t, bytes);
    if (s < 0) continue;
    if (t.way.route == rule && (incumbent_t < 0 || s < incumbent_t)) {
      incumbent = t.way;
      incumbent_t = s;
    }
    if (best_t < 0 || s < best_t) {
      best = t.way;
      best_t = s;
    }
  }
  if (incumbent_t < 0) return incumbent;  // nothing to compare with
  const bool clear_win = best_t < (1.0 - kSwitchMargin) * incumbent_t && incumbent_t - best_t >= kMinGainSeconds;
  return clear_win ? best : incumbent;
}

namespace {

std::string sizeName(size_t bytes) {
  if (bytes >= (size_t(1) << 20) && bytes % (size_t(1) << 20) == 0) return strCat(bytes >> 20, " MiB");
  if (bytes >= 1024 && bytes % 1024 == 0) return strCat(bytes >> 10, " KiB");
  return strCat(bytes, " B");
}

std::string milliseconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", seconds * 1e3);
  return buf;
}

}  // namespace

std::string DeviceRouteModel::describe() const {
  std::string s = "ms at";
  for (size_t i = 0; i < sizes_.size(); ++i) s += strCat(i ? ", " : " ", sizeName(sizes_[i]));
  const char* sep = ": ";
  for (const Timed& t : ways_) {
    if (t.seconds.front() < 0) continue;
    s += strCat(sep, deviceRouteName(t.way.route));
    if (t.way.route == DeviceRoute::kStaged && t.way.host != kAutoReducer) s += strCat(":", reducerName(t.way.host));
    sep = "; ";
    for (double v : t.seconds) s += strCat(" ", milliseconds(v));
  }
  return s;
}

}  // namespace hvdtorch
