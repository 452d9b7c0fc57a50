// The pass counter's rules (gradients/pass_counter.h), driven by hand: which
// pass reduces, what no_sync() passes do, the strict limit and its message,
// the cyclic count, reset() and changing k.
#include <string>

#include "check.h"
#include "common/error.h"
#include "gradients/pass_counter.h"

using namespace hvdtorch;

namespace {

PassCounterOptions opts(int k, bool strict) {
  PassCounterOptions o;
  o.passes_per_step = k;
  o.strict = strict;
  o.rank = 3;
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs a whole pass; returns whether it reduced.
bool pass(PassCounter& c, const std::string& subject = "") {
  const bool r = c.beginPass(subject);
  CHECK(c.inPass());
  c.endPass();
  CHECK(!c.inPass());
  return r;
}

}  // namespace

TEST(kth_counted_pass_reduces) {
  PassCounter c(opts(3, true));
  CHECK(!c.pending());
  CHECK(!pass(c));
  CHECK(c.pending() && !c.due());
  CHECK(!pass(c));
  CHECK(pass(c));
  CHECK(c.due() && c.reducing());
  c.reset();
  CHECK(!c.pending());
  CHECK(!pass(c));
}

TEST(strict_extra_pass_raises_before_counting) {
  PassCounter c(opts(2, true));
  pass(c);
  pass(c);
  std::string what;
  try {
    c.beginPass();
  } catch (const PassLimitError& e) {
    what = e.what();
  }
  CHECK(contains(what, "rank 3: backward pass 3 since the last step(), but backward_passes_per_step=2"));
  CHECK(contains(what, "after every 2 backward passes, or raise backward_passes_per_step"));
  CHECK(c.passes() == 2 && !c.inPass());
  try {
    c.beginPass("layer.weight");
  } catch (const PassLimitError& e) {
    what = e.what();
  }
  CHECK(contains(what, "parameter 'layer.weight' got a gradient in backward pass 3"));
  PassCounter one(opts(1, true));
  pass(one);
  try {
    one.beginPass();
  } catch (const PassLimitError& e) {
    what = e.what();
  }
  CHECK(contains(what, "after every 1 backward pass, or"));
}

TEST(local_passes_are_not_counted) {
  PassCounter c(opts(1, true));
  c.setLocal(true);
  CHECK(!pass(c));
  CHECK(!pass(c));
  CHECK(!c.pending());
  c.setLocal(false);
  CHECK(pass(c));
  c.setLocal(true);
  CHECK(!pass(c));  // after the k-th pass, no_sync() passes still run
  CHECK(c.due());
}

TEST(cyclic_count_starts_again) {
  PassCounter c(opts(2, false));
  for (int step = 0; step < 3; ++step) {
    CHECK(!pass(c));
    CHECK(pass(c));
  }
}

TEST(changing_k) {
  PassCounter c(opts(1, true));
  pass(c);
  c.setPassesPerStep(2);
  CHECK(c.passes() == 1);
  CHECK(pass(c));
  c.reset(3);
  CHECK(c.passesPerStep() == 3 && !c.pending());
  bool threw = false;
  try {
    c.reset(0);
  } catch (const InvalidArgument& e) {
    threw = contains(e.what(), "backward_passes_per_step must be >= 1, got 0");
  }
  CHECK(threw);
  CHECK_THROWS(PassCounter(opts(0, false)), InvalidArgument);
}

HVD_TEST_MAIN()
