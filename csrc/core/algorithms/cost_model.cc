#include "algorithms/cost_model.h"

#include <algorithm>
#include <cmath>

namespace hvdtorch {

namespace {

// A generic all-reduce cost shape (50 us + n / 2 GB/s), only used to move a
// sample taken at n bytes to its band's size (at most a factor 2 away) and an
// estimate back; the same for every reducer, so it does not bias a choice.
double shape(size_t bytes) { return 50e-6 + 0.5e-9 * static_cast<double>(bytes); }

}  // namespace

int SizeBands::of(size_t bytes) {
  int band = 0;
  // Band b+1 starts at twice band b's size.
  while (band + 1 < kCount && bytes >= 2 * SizeBands::bytes(band)) ++band;
  return band;
}

CostModel::CostModel(std::vector<double> alpha, std::vector<double> beta)
    : alpha_(std::move(alpha)), beta_(std::move(beta)) {
  const size_t cells = SizeBands::kCount * alpha_.size();
  window_.assign(cells, {});
  count_.assign(cells, 0);
  count_at_fold_.assign(cells, 0);
  agreed_.assign(cells, -1.0);
  incumbent_.fill(kAutoReducer);
  challenger_.fill(kAutoReducer);
}

ReducerId CostModel::anchor(int band, const std::vector<bool>& anchors) const {
  ReducerId best = kAutoReducer;
  for (size_t i = 0; i < reducers(); ++i) {
    const auto id = static_cast<ReducerId>(i);
    if (i < anchors.size() && anchors[i] &&
        (best == kAutoReducer || prior(id, SizeBands::bytes(band)) < prior(best, SizeBands::bytes(band))))
      best = id;
  }
  return best;
}

bool CostModel::confirmed(int band) const {
  const ReducerId ch = challenger_[band];
  return ch == kAutoReducer || count_[cell(band, ch)] >= challenge_from_[band] + kExploreSamples;
}

ReducerId CostModel::incumbent(int band, const std::vector<bool>& anchors) const {
  const ReducerId id = incumbent_[band];
  return id != kAutoReducer && id < anchors.size() && anchors[id] ? id : anchor(band, anchors);
}

double CostModel::prior(ReducerId id, size_t bytes) const {
  const double n = static_cast<double>(bytes);
  double t = alpha_[id] + beta_[id] * n;
  if (id < link_alpha_.size()) t += link_alpha_[id] + link_beta_[id] * n;
  return t;
}

void CostModel::setLinkPriors(const LinkCost& link, std::vector<double> alpha, std::vector<double> beta) {
  link_ = link;
  link_alpha_ = std::move(alpha);
  link_beta_ = std::move(beta);
}

bool CostModel::spared(int band, ReducerId id, const std::vector<bool>& anchors) const {
  if (!link_.known() || link_alpha_.empty()) return false;
  const ReducerId inc = incumbent(band, anchors);
  if (inc == kAutoReducer || inc == id) return false;
  const size_t bytes = SizeBands::bytes(band);
  return prior(id, bytes) >= kSpareFactor * estimate(inc, bytes);
}

double CostModel::estimate(ReducerId id, size_t bytes) const {
  const int band = SizeBands::of(bytes);
  const double m = agreed_[cell(band, id)];
  return m < 0 ? prior(id, bytes) : m * shape(bytes) / shape(SizeBands::bytes(band));
}

std::pair<double, double> CostModel::line(ReducerId id) const {
  const size_t lo = SizeBands::bytes(0), hi = SizeBands::bytes(SizeBands::kCount - 1);
  const double beta = (estimate(id, hi) - estimate(id, lo)) / static_cast<double>(hi - lo);
  return {estimate(id, lo) - beta * static_cast<double>(lo), beta};
}

ReducerId CostModel::choose(size_t bytes, const std::vector<bool>& candidates, const std::vector<bool>& anchors) const {
  const ReducerId inc = incumbent(SizeBands::of(bytes), anchors);
  if (inc != kAutoReducer && inc < candidates.size() && candidates[inc]) return inc;
  ReducerId best = kAutoReducer;
  for (size_t i = 0; i < reducers() && i < candidates.size(); ++i) {
    const auto id = static_cast<ReducerId>(i);
    if (candidates[i] && (best == kAutoReducer || estimate(id, bytes) < estimate(best, bytes))) best = id;
  }
  return best;
}

ReducerId CostModel::pickForRun(size_t bytes, const std::vector<bool>& candidates, const std::vector<bool>& anchors) {
  const int band = SizeBands::of(bytes);
  if (++auto_ops_[band] % kExplorePeriod == 0) {
    // One candidate at a time, so each is judged as soon as it has its samples.
    for (size_t i = 0; i < reducers() && i < candidates.size() && i < anchors.size(); ++i)
      if (candidates[i] && anchors[i] && count_[cell(band, static_cast<ReducerId>(i))] < kExploreSamples &&
          !spared(band, static_cast<ReducerId>(i), anchors))
        return static_cast<ReducerId>(i);
    const ReducerId ch = challenger_[band];
    if (ch != kAutoReducer && ch < candidates.size() && candidates[ch] && !confirmed(band)) return ch;
  }
  return choose(bytes, candidates, anchors);
}

void CostModel::observe(ReducerId id, size_t bytes, double seconds) {
  if (id >= reducers() || !(seconds >= 0)) return;
  const int band = SizeBands::of(bytes);
  const size_t c = cell(band, id);
  window_[c][count_[c] % kWindow] = seconds * shape(SizeBands::bytes(band)) / shape(bytes);
  ++count_[c];
}

std::vector<double> CostModel::localStats() const {
  std::vector<double> stats(agreed_.size(), -1.0);
  for (size_t c = 0; c < stats.size(); ++c) {
    // A challenger is judged on its confirmation samples alone.
    const size_t band = c / reducers();
    const uint32_t since = challenger_[band] == c % reducers() ? challenge_from_[band] : 0;
    const size_t n = std::min<size_t>(count_[c] - since, kWindow);
    if (n == 0) continue;
    std::array<double, kWindow> w;  // the last n samples of the ring buffer
    for (size_t j = 0; j < n; ++j) w[j] = window_[c][(count_[c] - n + j) % kWindow];
    const size_t k = static_cast<size_t>(kQuantile * static_cast<double>(n - 1));
    std::nth_element(w.begin(), w.begin() + k, w.begin() + n);
    stats[c] = w[k];
  }
  return stats;
}

bool CostModel::fold(const std::vector<double>& agreed, const std::vector<bool>& anchors) {
  bool learnt = false;
  std::vector<bool> fresh(agreed_.size(), false);  // samples since the previous fold
  for (size_t c = 0; c < agreed_.size() && c < agreed.size(); ++c) {
    if (agreed[c] >= 0) agreed_[c] = agreed_[c] < 0 ? agreed[c] : std::min(agreed_[c], agreed[c]);
    if (count_at_fold_[c] == 0 && count_[c] > 0) learnt = true;
    fresh[c] = count_[c] > count_at_fold_[c];
    count_at_fold_[c] = count_[c];
  }
  for (int band = 0; band < SizeBands::kCount; ++band) {
    const ReducerId inc = incumbent(band, anchors);
    incumbent_[band] = inc;
    if (inc == kAutoReducer || switches_[band] >= kMaxSwitches) continue;
    // Compared: the windows as of now, taken over the same stretch of time
    // (a candidate's samples interleave with the incumbent's while it is
    // explored), so a quiet or a busy spell counts for both alike.
    const double inc_t = agreed[cell(band, inc)];
    if (inc_t < 0 || count_[cell(band, inc)] < kMatureSamples) continue;  // not enough evidence yet
    ReducerId best = inc;
    double best_t = inc_t;
    for (size_t i = 0; i < reducers() && i < anchors.size(); ++i) {
      const size_t c = cell(band, static_cast<ReducerId>(i));
      if (anchors[i] && fresh[c] && count_[c] >= kExploreSamples && agreed[c] >= 0 && agreed[c] < best_t) {
        best = static_cast<ReducerId>(i);
        best_t = agreed[c];
      }
    }
    // A win counts twice: first it names a challenger, then the challenger
    // must win again on kExploreSamples new samples of its own.
    ReducerId& ch = challenger_[band];
    if (ch != kAutoReducer && !confirmed(band)) continue;  // judged when its samples are in
    const bool wins = best != inc && best_t < (1 - kSwitchMargin) * inc_t && inc_t - best_t > kMinGainSeconds;
    if (!wins) {
      ch = kAutoReducer;  // not faster after all (or the incumbent caught up)
    } else if (ch == best) {
      incumbent_[band] = best;
      ++switches_[band];
      ch = kAutoReducer;
      learnt = true;
    } else {
      ch = best;
      challenge_from_[band] = count_[cell(band, best)];
      learnt = true;
    }
  }
  return learnt;
}

}  // namespace hvdtorch
