// The cost model behind reducer `auto`: which reducer an n-byte all-reduce
// runs, learnt from measured times, identical on every rank.
//
// Sizes fall into bands, one per power of 4 from 4 KiB to 256 MiB; an op
// belongs to the band whose size is nearest on a log scale (smaller ops to the
// first band, larger ones to the last). Per band and reducer the model holds:
//  * a prior: the registry's alpha + beta·n at the band's size, plus across
//    hosts what the reducer's traffic costs on the measured link
//    (setLinkPriors, link_cost.h), the guess before anything is measured;
//  * samples: this rank's last kWindow times of that reducer on ops of the
//    band (every all-reduce the executor ran, `auto` or named, and the
//    calibration's repetitions), each scaled to the band's size;
//  * the agreed statistic: at every fold, the min over ranks of each rank's
//    median of its window (the median ignores stragglers, a rep that a busy
//    core delayed; the rank that arrived last timed the collective without
//    waiting for the others). The estimate keeps the lowest agreed value so
//    far (a min of medians): what estimate() and reduce-scatter use;
//  * the incumbent: the reducer `auto` runs in the band.
//
// Choice and hysteresis. A band's first incumbent is the candidate the priors
// rank cheapest: the same on every rank and in every run, whatever the noise.
// A fold replaces it only with a candidate that has fresh evidence (at least
// kExploreSamples samples, some new since the previous fold) and whose
// current agreed window median is below (1 - kSwitchMargin) times the
// incumbent's. Both windows then cover the same stretch of time (while a
// candidate is explored its samples interleave with the incumbent's), so a
// quiet or a busy spell of the machine counts for both alike. Once a band's
// exploration is over, no candidate has fresh samples (unless ops name it),
// so the choice stays put whatever the load does: no oscillation; and each
// band switches at most kMaxSwitches times all the same. The margin is 20%:
// on a loaded 2-core host, reducers within 10-15% of each other swap places
// from run to run (measured: 4 KiB node/central/ring, 1 MiB node/ring), and
// keeping the prior's choice among such near-ties costs at most the margin,
// while a candidate that is clearly faster still wins. And a win must be
// confirmed: the first names the candidate challenger, which is explored for
// kExploreSamples more ops and replaces the incumbent only if it wins again
// on those new samples alone (a lucky window of four, measured: a 16 MiB
// near-tie switched in 1 of 10 runs, is not confirmed by the next four).
// Until the confirmation's samples are in, the band is not judged. Nor is an
// incumbent judged on fewer than kMatureSamples samples of its own: its first times are
// the noisiest (first use, load). And a switch must save kMinGainSeconds per
// op: below 4-64 KiB the reducers differ by tens of microseconds, less than
// the scheduling noise of one op's negotiation and hand-offs (100-200 us per
// op at 2 ranks here), so they would swap places from run to run for nothing.
//
// Exploration (sparing). While a candidate has fewer than kExploreSamples
// samples in a band, every kExplorePeriod-th `auto` op of that band runs it
// instead of the incumbent, one candidate after the other (by ReducerId), so
// each is judged at the first fold after its samples are in; then a
// challenger's confirmation samples, the same way. So a large band is
// measured on the real ops, never on a scratch copy, at the cost of a few ops
// run by a slower reducer once per job. Across hosts that cost can be
// seconds (a 50 MB all-reduce that sends 1.5x the bytes over a 100 Mbit/s
// link takes 2 s longer), so there a candidate whose link-aware prior is at
// least kSpareFactor times the incumbent's estimate is not explored: where
// the link decides, bytes on the wire are what the prior counts exactly. On
// one host (no link priors) every candidate is explored.
//
// Agreement. All ranks must run the same reducer for the same op. Everything
// that decides (incumbents, estimates, which op explores) depends only on the
// op sequence, which is the same on every rank (so are sample counts and op
// counters), and on fold()'s input, which the caller min-reduces over ranks
// first (ReducerSet::agree). Local times never decide anything directly.
//
// Not thread-safe; ReducerSet serialises access.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "algorithms/link_cost.h"
#include "algorithms/reducer.h"

namespace hvdtorch {

// Size bands: band b stands for kFirstBytes << 2b.
struct SizeBands {
  static constexpr int kCount = 9;  // 4 KiB .. 256 MiB
  static constexpr size_t kFirstBytes = size_t(4) << 10;
  static size_t bytes(int band) { return kFirstBytes << (2 * band); }
  // The band nearest to `bytes` on a log scale (edges at twice a band's size).
  static int of(size_t bytes);
};

class CostModel {
 public:
  static constexpr int kWindow = 16;
  static constexpr double kQuantile = 0.5;
  static constexpr double kSwitchMargin = 0.20;
  static constexpr double kMinGainSeconds = 50e-6;
  static constexpr int kMaxSwitches = 3;
  static constexpr uint32_t kMatureSamples = 8;
  static constexpr int kExploreSamples = 4;
  static constexpr int kExplorePeriod = 2;
  static constexpr double kSpareFactor = 1.3;

  CostModel() = default;
  // Priors per reducer (indexed by ReducerId): seconds, seconds per byte.
  CostModel(std::vector<double> alpha, std::vector<double> beta);

  size_t reducers() const { return alpha_.size(); }

  // The reducer `auto` runs for `bytes` among `candidates` (by ReducerId: may
  // `auto` run it for this dtype/op here). `anchors` are the candidates for
  // the calibration's dtype and op (float32 Sum), which the incumbent is
  // chosen among; when the incumbent cannot serve this op, the cheapest
  // candidate by estimate. kAutoReducer when nothing is a candidate.
  ReducerId choose(size_t bytes, const std::vector<bool>& candidates, const std::vector<bool>& anchors) const;
  // As choose(), but counts the op towards its band's exploration schedule and
  // may return an under-sampled candidate instead. For ops that then run.
  ReducerId pickForRun(size_t bytes, const std::vector<bool>& candidates, const std::vector<bool>& anchors);

  // Estimated seconds of `id` for `bytes`: the agreed estimate of the band,
  // scaled from the band's size to `bytes`, or the prior where unmeasured.
  double estimate(ReducerId id, size_t bytes) const;
  // The line through estimate(id, ...) at the smallest and the largest
  // band's size: {seconds, seconds per byte}. A summary for people
  // (hvdtorch's cost_model()); the model itself is per size band.
  std::pair<double, double> line(ReducerId id) const;
  // The agreed estimate at the band's size; < 0: not measured yet.
  double measured(int band, ReducerId id) const { return agreed_[cell(band, id)]; }
  double prior(ReducerId id, size_t bytes) const;
  // The link between hosts and, per reducer (by ReducerId), the line that its
  // traffic costs on it (link_cost.h: linkSeconds() as alpha + beta·n), added
  // to the registry's priors; replaces any earlier link priors. Identical on
  // every rank (the link is agreed), like everything else that decides.
  void setLinkPriors(const LinkCost& link, std::vector<double> alpha, std::vector<double> beta);
  const LinkCost& link() const { return link_; }
  // Whether `id` is not explored in `band` (see Exploration above).
  bool spared(int band, ReducerId id, const std::vector<bool>& anchors) const;
  // Samples seen so far (not only those in the window).
  uint32_t samples(int band, ReducerId id) const { return count_[cell(band, id)]; }
  int switches(int band) const { return switches_[band]; }

  // Records one timing of this rank.
  void observe(ReducerId id, size_t bytes, double seconds);
  // This rank's statistic per band and reducer (band-major, reducer-minor);
  // -1 where it has no sample (alike on every rank). Min-reduce it over
  // ranks, then fold() it.
  std::vector<double> localStats() const;
  // Folds agreed statistics (localStats() min-reduced over ranks) into the
  // estimates and revisits every band's incumbent among `anchors`. Returns
  // whether anything new was learnt: an incumbent changed, or a band and
  // reducer got its first samples since the previous fold.
  bool fold(const std::vector<double>& agreed, const std::vector<bool>& anchors);

 private:
  size_t cell(int band, ReducerId id) const { return static_cast<size_t>(band) * alpha_.size() + id; }
  // The prior's cheapest anchor for `band`; kAutoReducer if none.
  ReducerId anchor(int band, const std::vector<bool>& anchors) const;
  ReducerId incumbent(int band, const std::vector<bool>& anchors) const;
  // No challenger in `band`, or its confirmation samples are all in.
  bool confirmed(int band) const;

  std::vector<double> alpha_, beta_;            // priors: the registry's
  LinkCost link_;                               // unknown on one host
  std::vector<double> link_alpha_, link_beta_;  // priors: the link's share, by ReducerId (empty: none)
  // Per cell (band x reducer):
  std::vector<std::array<double, kWindow>> window_;  // this rank's samples, ring buffer
  std::vector<uint32_t> count_;                      // samples observed (identical on every rank)
  std::vector<uint32_t> count_at_fold_;              // count_ at the previous fold
  std::vector<double> agreed_;                       // agreed estimate; -1: none
  // Per band:
  std::array<ReducerId, SizeBands::kCount> incumbent_{};
  std::array<int, SizeBands::kCount> switches_{};
  std::array<uint64_t, SizeBands::kCount> auto_ops_{};
  std::array<ReducerId, SizeBands::kCount> challenger_{};     // kAutoReducer: none
  std::array<uint32_t, SizeBands::kCount> challenge_from_{};  // its count_ when named
};

}  // namespace hvdtorch
