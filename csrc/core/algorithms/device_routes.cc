#include "algorithms/device_routes.h"

#include <algorithm>
#include <cstdio>

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

DeviceRouteModel::DeviceRouteModel(std::vector<size_t> sizes, std::array<std::vector<double>, kDeviceRoutes> seconds)
    : sizes_(std::move(sizes)), seconds_(std::move(seconds)) {
  if (sizes_.empty() || !std::is_sorted(sizes_.begin(), sizes_.end()) || sizes_.front() == 0)
    throw InvalidArgument("device route model: probe sizes must be positive and ascending");
  for (auto& s : seconds_) {
    if (s.empty()) s.assign(sizes_.size(), -1.0);
    if (s.size() != sizes_.size()) throw InvalidArgument("device route model: one time per probe size");
  }
}

double DeviceRouteModel::estimate(DeviceRoute route, size_t bytes) const {
  const std::vector<double>& t = seconds_[static_cast<int>(route)];
  for (double v : t)
    if (v < 0) return -1.0;
  const auto b = static_cast<double>(bytes);
  if (bytes <= sizes_.front()) return t.front();
  if (bytes >= sizes_.back()) return t.back() * b / static_cast<double>(sizes_.back());
  const size_t hi = static_cast<size_t>(std::upper_bound(sizes_.begin(), sizes_.end(), bytes) - sizes_.begin());
  const double x0 = static_cast<double>(sizes_[hi - 1]), x1 = static_cast<double>(sizes_[hi]);
  return t[hi - 1] + (t[hi] - t[hi - 1]) * (b - x0) / (x1 - x0);
}

DeviceRoute DeviceRouteModel::choose(size_t bytes, const DeviceRouteMask& serves, DeviceRoute rule) const {
  const double incumbent = estimate(rule, bytes);
  if (incumbent < 0) return rule;  // nothing to compare with
  DeviceRoute best = rule;
  double best_t = incumbent;
  for (int r = 0; r < kDeviceRoutes; ++r) {
    const auto route = static_cast<DeviceRoute>(r);
    const double t = serves[r] ? estimate(route, bytes) : -1.0;
    if (t >= 0 && t < best_t) {
      best = route;
      best_t = t;
    }
  }
  const bool clear_win = best_t < (1.0 - kSwitchMargin) * incumbent && incumbent - best_t >= kMinGainSeconds;
  return clear_win ? best : rule;
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
  for (int r = 0; r < kDeviceRoutes; ++r) {
    if (seconds_[r].front() < 0) continue;
    s += strCat(sep, deviceRouteName(static_cast<DeviceRoute>(r)));
    sep = "; ";
    for (double t : seconds_[r]) s += strCat(" ", milliseconds(t));
  }
  return s;
}

}  // namespace hvdtorch
