"""Autotune (HVDTORCH_AUTOTUNE=1): picks the fusion size and the cycle time
by measured training throughput during the first steps, then freezes them.

What is tuned, and how a setting is applied
  fusion bytes  the bucket cap of the tuned DistributedModel (or
                DistributedOptimizer), whose buckets are rebuilt with a
                layout from plan_buckets over the agreed gradient order --
                the same on every rank -- and the engine's fusion threshold,
                set to the same value (engine buckets that become ready
                together fuse up to it). 0 means one all-reduce per gradient.
  cycle time    the engine's negotiation cycle (Engine::setCycleTime).

Search: coordinate search over a small fixed grid, simple on purpose.
  Phase 1 tries every fusion candidate at the starting cycle time
  (HVDTORCH_CYCLE_TIME); phase 2 tries every other cycle-time candidate at
  the best fusion size. Each phase runs HVDTORCH_AUTOTUNE_ROUNDS rounds over
  its candidates, alternating direction (A B C, C B A) so that a drift in
  the machine's load favours no candidate; a setting scores the median of
  its trials. The best-scoring setting is frozen. Horovod fits a
  Gaussian process to the samples instead (Bayesian optimisation); with a
  handful of candidates, few steps per trial and a noisy shared host, a grid
  measured by medians is cheaper to reason about and cannot wander off.

A trial
  switch at a step boundary, run HVDTORCH_AUTOTUNE_WARMUP_STEPS steps
  untimed (a new layout means new bucket names, negotiated in full once, and
  buffers that grow), then time HVDTORCH_AUTOTUNE_STEPS_PER_TRIAL steps.
  Score = gradient bytes reduced per second = bytes per step / the median
  step time, where each step's time is the longest any rank saw (a step
  ends when its slowest rank ends it). The median ignores a straggling step.

Agreement across ranks
  Every rank times its own steps; at the end of a trial one all-reduce
  of the step times gives every rank the same numbers, from which every rank
  computes the same score and, from identical search state, the same next
  setting: nothing is broadcast and no rank decides for the others. The
  switch happens on every rank at the same step boundary, right after that
  all-reduce, with none of the tuned gradients in flight -- what the
  engine's fusion threshold needs (engine.h) and what a rebuild needs.

Step boundaries
  DistributedModel: each forward with grad enabled, once the bucket order
  has been agreed (its first steps). DistributedOptimizer: the end of each
  step(). Every rank must run the same steps (the usual data-parallel loop)
  -- except that a rank may run out of data (hvd.join()): the agreement
  sees it missing, the others stop switching, and join() ends tuning on
  every rank with the setting in effect.

Scope
  One tuner per init(): the first DistributedModel or DistributedOptimizer
  built with autotune on, over the global process set, with fusion on
  (fusion_bytes > 0, default groups) and more than one rank. Later ones keep
  their own settings. The engine settings it freezes apply to every op, so
  a loop that keeps asynchronous ops of its own in flight across step
  boundaries (hvd.allreduce_async_ waited for a step later) must not tune:
  a switch would find them half-negotiated.

Log (HVDTORCH_AUTOTUNE_LOG, written by rank 0, rewritten after each trial
so an interrupted run keeps what it measured): CSV with columns
trial, fusion_bytes, cycle_time_ms, score (bytes/s), median_step_s, chosen
(1 on the trials of the setting that was frozen).
"""

import csv
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from . import _C, runtime
from .collectives import ops

MiB = 1 << 20
# The grid. Fusion sizes span "no fusion" to the engine's default
# threshold; cycle times span eager polling to a relaxed pace.
FUSION_CANDIDATES = (0, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB)
CYCLE_CANDIDATES_MS = (0.2, 1.0, 5.0)


@dataclass(frozen=True)
class Setting:
    fusion_bytes: int
    cycle_time_ms: float


@dataclass
class Trial:
    index: int
    setting: Setting
    score: float  # bytes per second; higher is better
    median_step_s: float


class CoordinateSearch:
    """The search alone, without timing or communication: next() says what
    to measure, report() takes its score. Deterministic, so that ranks fed
    the same scores walk the same path.

    Each phase measures its candidates `rounds` times, alternating the
    direction (A B C, C B A, ...) so that a steady drift in the machine's
    load does not favour the candidates measured first; a setting's score is
    the median of its trials' scores."""

    def __init__(
        self,
        fusion_candidates: Sequence[int],
        cycle_candidates_ms: Sequence[float],
        start_cycle_ms: float,
        rounds: int = 1,
    ):
        if not fusion_candidates:
            raise ValueError("hvdtorch: autotune needs at least one fusion candidate")
        self._cycles = [float(c) for c in cycle_candidates_ms]
        self._start_cycle = float(start_cycle_ms)
        self._rounds = max(1, int(rounds))
        self._queue = self._interleave([Setting(int(f), self._start_cycle) for f in fusion_candidates])
        self._phase = 1
        self.trials: List[Trial] = []

    def _interleave(self, settings: List[Setting]) -> List[Setting]:
        out: List[Setting] = []
        for r in range(self._rounds):
            out += settings if r % 2 == 0 else settings[::-1]
        return out

    def next(self) -> Optional[Setting]:
        """The setting to measure next; None once the search is over."""
        if not self._queue and self._phase == 1:
            self._phase = 2
            fusion = self.best().fusion_bytes
            self._queue = self._interleave([Setting(fusion, c) for c in self._cycles if c != self._start_cycle])
        return self._queue[0] if self._queue else None

    def report(self, score: float, median_step_s: float = float("nan")) -> None:
        """The score of the setting next() returned."""
        setting = self.next()
        if setting is None:
            raise RuntimeError("hvdtorch: autotune search is already over")
        self._queue.pop(0)
        self.trials.append(Trial(len(self.trials), setting, float(score), float(median_step_s)))

    def scores(self) -> Dict[Setting, float]:
        """Every measured setting's score (the median over its trials), in the order first measured."""
        by_setting: Dict[Setting, List[float]] = {}
        for t in self.trials:
            by_setting.setdefault(t.setting, []).append(t.score)
        return {s: statistics.median(v) for s, v in by_setting.items()}

    def best(self) -> Setting:
        scores = self.scores()
        # max() keeps the first of equal scores: the same choice on every rank.
        return max(scores, key=lambda s: scores[s])


def apply_setting(setting: Setting, set_fusion_bytes: Callable[[int], None]) -> None:
    """Puts a setting into effect on this rank: the caller's bucket cap and
    the engine's fusion threshold and cycle time. Every rank must apply the
    same setting at the same step boundary, with no op in flight."""
    engine = runtime.state().engine
    set_fusion_bytes(setting.fusion_bytes)
    engine.set_fusion_threshold(setting.fusion_bytes)
    engine.set_cycle_time_ms(setting.cycle_time_ms)


class Autotuner:
    """Drives a CoordinateSearch from step boundaries (see the module doc)."""

    def __init__(
        self,
        name: str,
        bytes_per_step: int,
        set_fusion_bytes: Callable[[int], None],
        search: CoordinateSearch,
        warmup_steps: int,
        steps_per_trial: int,
        log_path: str = "",
    ):
        self._name = name
        self._bytes = max(1, int(bytes_per_step))
        self._set_fusion_bytes = set_fusion_bytes
        self.search = search
        self._warmup = max(0, int(warmup_steps))
        self._steps = max(1, int(steps_per_trial))
        self._log_path = log_path
        self._rank = runtime.rank()
        self._last: Optional[float] = None  # time of the previous boundary
        self._since_switch = 0  # step times recorded since the last switch
        self._times: List[float] = []
        self._current: Optional[Setting] = None  # in effect on every rank; None before the first switch
        self.done = False
        # The setting kept: the best one, or, when a rank joined during
        # tuning, the one in effect then (None if tuning had not started).
        self.frozen: Optional[Setting] = None

    def step_boundary(self) -> None:
        """Called on every rank between two steps (nothing in flight)."""
        if self.done:
            return
        now = _now()
        if self._last is None:  # the first boundary: start the first trial
            self._switch(self.search.next())
            self._last = _now()
            return
        self._since_switch += 1
        if self._since_switch > self._warmup:
            self._times.append(now - self._last)
        if len(self._times) < self._steps:
            self._last = now
            return
        slowest = self._agree(self._times)
        if slowest is None:  # a rank has joined: it keeps the current setting, so must everyone
            self.stop()
            return
        median = statistics.median(slowest)
        self.search.report(self._bytes / median, median)
        following = self.search.next()
        if following is None:
            self._switch(self.search.best())
            self.stop()
        else:
            self._switch(following)
            self._write_log()
        self._last = _now()  # the agreement and the switch belong to no step

    def _agree(self, times: List[float]) -> Optional[List[float]]:
        """Every rank's step times -> each step's longest, the same list on
        every rank; None when some rank is absent (joined). A Sum over one
        row per rank, not a Max: all-reduces other than Sum/Average fail while
        a rank has joined, and adding zeros is exact."""
        size, rank = runtime.size(), self._rank
        rows = torch.zeros(size, len(times) + 1, dtype=torch.float64)
        rows[rank, :-1] = torch.tensor(times, dtype=torch.float64)
        rows[rank, -1] = 1.0  # present; a joined rank contributes 0
        rows = ops.allreduce(rows, op=ops.Sum, name=f"{self._name}.autotune.{len(self.search.trials)}")
        if not bool((rows[:, -1] == 1.0).all()):
            return None
        return rows[:, :-1].max(dim=0).values.tolist()

    def stop(self) -> None:
        """Ends tuning with the setting in effect. Called when tuning is
        over, and by hvd.join() on every rank (a rank that ran out of data
        stopped switching at the last agreement it took part in, which is
        where every other rank stops too)."""
        if self.done:
            return
        self.done = True
        self.frozen = self._current
        self._write_log()

    def _switch(self, setting: Setting) -> None:
        apply_setting(setting, self._set_fusion_bytes)
        self._current = setting
        self._since_switch = 0
        self._times = []

    def _write_log(self) -> None:
        if not self._log_path or self._rank != 0:
            return
        with open(self._log_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["trial", "fusion_bytes", "cycle_time_ms", "score", "median_step_s", "chosen"])
            for t in self.search.trials:
                w.writerow(
                    [
                        t.index,
                        t.setting.fusion_bytes,
                        t.setting.cycle_time_ms,
                        f"{t.score:.6g}",
                        f"{t.median_step_s:.6g}",
                        int(t.setting == self.frozen),
                    ]
                )


def _now() -> float:
    return time.perf_counter()


# The runtime state of the init() whose tuner is taken (one per init()), and that tuner.
_claimed_by: Optional[weakref.ref] = None
_current: Optional[weakref.ref] = None


def attach(
    name: str, params: Sequence[torch.Tensor], set_fusion_bytes: Callable[[int], None], process_set=None
) -> Optional[Autotuner]:
    """The tuner for a DistributedModel/DistributedOptimizer being built, or
    None: autotune off, already taken in this init(), one rank, or a process
    set other than the global one (engine settings are global). Every rank
    must build its models in the same order, so every rank gets the same
    answer."""
    global _claimed_by, _current
    st = runtime.state()
    knobs = _C.resolve_options(st.options)
    if not knobs["autotune"] or st.size < 2:
        return None
    if process_set is not None and process_set is not ops.global_process_set:
        return None
    if _claimed_by is not None and _claimed_by() is st:
        return None
    _claimed_by = weakref.ref(st)
    engine = st.engine
    search = CoordinateSearch(FUSION_CANDIDATES, CYCLE_CANDIDATES_MS, engine.cycle_time_ms(), knobs["autotune_rounds"])
    tuner = Autotuner(
        name,
        sum(p.numel() * p.element_size() for p in params),
        set_fusion_bytes,
        search,
        knobs["autotune_warmup_steps"],
        knobs["autotune_steps_per_trial"],
        knobs["autotune_log"],
    )
    _current = weakref.ref(tuner)
    return tuner


def joined() -> None:
    """hvd.join() completed (on every rank at the same point): tuning ends
    with the setting in effect (Autotuner.stop)."""
    tuner = current()
    if tuner is not None:
        tuner.stop()


runtime.on_join(joined)


def current() -> Optional[Autotuner]:
    """The tuner of the present init(), if one was attached and still lives."""
    if _current is None or _claimed_by is None or not runtime.is_initialized():
        return None
    return _current() if _claimed_by() is runtime.state() else None
