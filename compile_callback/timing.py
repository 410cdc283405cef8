"""StepTimer: step times without a host sync per step, kept by the batch's shape.

On CUDA each step is bracketed by two CUDA events and read only once the end event has completed
(``Event.query()`` never blocks), so the training loop never waits on the timer; events are reused once
read, and both are recorded on the stream the step started on (a new ``torch.cuda.Event`` and the
stream object ``record()`` looks up cost the H200's host ~10 us each, on a 4 ms step). On CPU the work is
synchronous and ``time.perf_counter`` is exact. Each sample carries a key (the batch's shapes), so
windows that saw different mixes of shapes can be compared shape by shape (:func:`paired_speedup`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable
from typing import Any

import torch


class StepTimer:
    """Times steps under a label ("eager", "compiled", a trial's name) and gives robust statistics.

    Args:
        device: where the steps run; CUDA devices are timed with events.
        keep: how many samples to keep per label (oldest dropped).

    Example:
        >>> timer = StepTimer(torch.device("cpu"))
        >>> timer.start(); ...; timer.stop("eager")
        >>> timer.median_ms("eager")
    """

    def __init__(self, device: torch.device, *, keep: int = 512) -> None:
        self.use_events = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.keep = keep
        self._samples: dict[str, deque[tuple[float, Hashable]]] = defaultdict(lambda: deque(maxlen=self.keep))
        self._pending: deque[tuple[str, Hashable, object, object]] = deque()
        self._started: object | None = None
        self._stream: object | None = None  # the current CUDA stream at start (the end is recorded on it too)
        self._free_events: list[object] = []  # CUDA events already read, for the next steps
        self._settle: dict[str, int] = {}
        self._seen: Counter[tuple[str, Hashable]] = Counter()

    def settle(self, label: str, steps: int) -> None:
        """Discards the first ``steps`` samples of each new key under ``label``: the first calls of a
        compiled region on a new shape warm up (CUDA graphs record on the third)."""
        self._settle[label] = steps

    def start(self) -> None:
        if self.use_events:
            self._stream = torch.cuda.current_stream(self.device)
        self._started = self._mark()

    def _mark(self) -> Any:
        """Now: a CUDA event recorded on the step's stream (a read one reused), or ``perf_counter`` seconds."""
        if not self.use_events:
            return time.perf_counter()
        event = self._free_events.pop() if self._free_events else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)  # type: ignore[attr-defined]
        return event

    def stop(self, label: str | None, key: Hashable = None) -> None:
        """Ends the step begun by :meth:`start`; ``label=None`` discards it (e.g. a step that compiled).
        ``key`` tells steps of different shapes apart (None: all alike)."""
        started, self._started = self._started, None
        if started is None:
            return
        if label is not None and label in self._settle:  # counted only where it settles: raw lengths would grow it every step
            self._seen[(label, key)] += 1
            if self._seen[(label, key)] <= self._settle[label]:
                label = None
        if label is None:
            if self.use_events:
                self._free_events.append(started)  # recorded, never read: a later record() replaces it
            return
        end = self._mark()
        if self.use_events:
            self._pending.append((label, key, started, end))
        else:
            self._samples[label].append((elapsed_ms(started, end), key))

    def add(self, label: str, ms: float, key: Hashable = None) -> None:
        """Records a time measured elsewhere (e.g. a checkpoint's eager median for one shape)."""
        self._samples[label].append((ms, key))

    def _drain(self, *, wait: bool = False) -> None:
        while self._pending:
            label, key, start, end = self._pending[0]
            if not wait and not end.query():  # type: ignore[attr-defined]
                break
            if wait:
                end.synchronize()  # type: ignore[attr-defined]
            self._pending.popleft()
            self._samples[label].append((elapsed_ms(start, end), key))
            self._free_events += (start, end)

    def samples_ms(self, label: str, *, wait: bool = False) -> list[float]:
        """Completed samples for ``label`` in milliseconds; ``wait=True`` waits for pending ones."""
        self._drain(wait=wait)
        return [ms for ms, _ in self._samples.get(label, ())]

    def samples_by_key(self, label: str, *, last: int | None = None, wait: bool = False) -> dict[Hashable, list[float]]:
        """Completed samples for ``label`` (the ``last`` ones only, if given) grouped by their key, in ms."""
        self._drain(wait=wait)
        grouped: dict[Hashable, list[float]] = defaultdict(list)
        for ms, key in _newest(list(self._samples.get(label, ())), last):
            grouped[key].append(ms)
        return dict(grouped)

    def median_ms(self, label: str, *, last: int | None = None, wait: bool = False) -> float | None:
        samples = _newest(self.samples_ms(label, wait=wait), last)
        return statistics.median(samples) if samples else None

    def keys(self, labels: tuple[str, ...]) -> Counter[Hashable]:
        """How many completed or pending steps of each key the ``labels`` hold."""
        counts: Counter[Hashable] = Counter(key for label in labels for _, key in self._samples.get(label, ()))
        counts.update(key for label, key, *_ in self._pending if label in labels)
        return counts

    def count(self, label: str) -> int:
        return len(self._samples.get(label, ())) + sum(1 for item in self._pending if item[0] == label)


def _newest(samples: list[Any], last: int | None) -> list[Any]:
    """The ``last`` newest samples (all of them for None, none for 0)."""
    return samples if last is None else samples[max(0, len(samples) - last):]


def lower_quartile(samples: list[float]) -> float:
    """The 25th percentile: steps a busy host slowed sit above it, so it moves less than the median under load."""
    ordered = sorted(samples)
    return statistics.quantiles(ordered, n=4, method="inclusive")[0] if len(ordered) > 1 else ordered[0]


def disturbed(samples: list[float], *, tolerance: float) -> bool:
    """Whether something slowed a good part of a window: its median more than ``tolerance`` above its
    lower decile. A busy host only adds time, in episodes of a few to tens of steps; a quiet GPU-bound
    window's steps lie within half a percent of each other (ResNet-50 eager on the H200: 29.30-29.41 ms)."""
    if len(samples) < 5:
        return False
    ordered = sorted(samples)
    low = statistics.quantiles(ordered, n=10, method="inclusive")[0]
    return low > 0 and statistics.median(ordered) > (1.0 + tolerance) * low


def paired_speedup(
    before: dict[Hashable, list[float]],
    after: dict[Hashable, list[float]],
    *,
    min_share: float = 0.0,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> tuple[float, float] | None:
    """How much faster ``after``'s steps ran than ``before``'s, shape by shape, and the relative noise.

    Each key's median (or ``statistic``) in ``before`` prices the same key's steps in ``after``: the speedup is what
    ``after``'s steps would have taken before over what they took (per-key medians, so one slow step
    moves little where a shape has several). Windows that saw different mixes of shapes (variable-length batches) so compare
    like with like; with one shape it is the ratio of the two medians. The noise is the relative
    standard error of that ratio: each window's steps around their own key's median, combined, from
    the keys with three steps or more (one or two steps sit on their median and would hide the
    spread). None when no key was timed in both, or when the steps of shared keys are fewer than
    ``min_share`` of ``after``'s (the pricing would rest on a few steps).
    """
    shared = [key for key in after if key in before and after[key] and before[key]]
    if not shared or sum(len(after[key]) for key in shared) < min_share * sum(map(len, after.values())):
        return None
    priced = sum(len(after[key]) * statistic(before[key]) for key in shared)
    took = sum(len(after[key]) * statistic(after[key]) for key in shared)

    def noise(window: dict[Hashable, list[float]]) -> float:
        keys = [key for key in shared if len(window[key]) >= 3] or shared
        return median_noise([ms / statistics.median(window[key]) for key in keys for ms in window[key]])

    return (priced / took if took > 0 else 0.0), math.hypot(noise(before), noise(after))


# compile/speedup is priced shape by shape when at least this share of the latest steps have a shape
# the eager baseline saw; else it compares medians.
STEADY_PRICED_SHARE = 0.5


def steady_speedup(
    priced: tuple[float, float] | None,
    *,
    kept: bool,
    eager_by_shape: dict[Hashable, list[float]] | None,
    latest: dict[Hashable, list[float]] | None,
    eager_ms: float | None,
    compiled_ms: float | None,
) -> tuple[float | None, str]:
    """``compile/speedup`` and how it was priced: ``"trials"`` / ``"nothing compiled"``, ``"shape by shape"``
    or ``"medians"``.

    A searched plan is priced by its trials (``priced``: each kept step measured beside the plan before
    it), not by the eager baseline, which runs while clocks, allocator and host still settle (on the
    H200 it read 11-16% slow on third-party models). Otherwise eager median over compiled median; with
    variable shapes (``eager_by_shape`` and the ``latest`` steps by shape given) each latest step is
    priced by the eager median of its own shape (:func:`paired_speedup`), so a plan that changes nothing
    reads 1.0 -- if most of them have a shape the baseline saw (raw lengths rarely recur).
    """
    if priced is not None:
        return priced[0], "trials" if kept else "nothing compiled"
    if eager_by_shape is not None and latest is not None:
        paired = paired_speedup(eager_by_shape, latest, min_share=STEADY_PRICED_SHARE)
        if paired is not None:
            return paired[0], "shape by shape"
    return ((eager_ms / compiled_ms) if eager_ms and compiled_ms else None), "medians"


def median_interval(values: list[float], coverage: float = 0.9) -> tuple[float, float]:
    """An interval that holds the median of what ``values`` sample with at least ``coverage``: the k-th
    lowest and k-th highest value, k the largest with 2 P(Binomial(n, 1/2) < k) <= 1 - coverage; the
    lowest and highest where no k > 1 does (fewer than 8 values at 0.9), whatever they cover: two values
    50%, three 75%, four 87.5%, five to seven 94-98%.
    More values give a narrower interval, where the range only widens."""
    if not values:
        raise ValueError("median_interval needs at least one value.")
    ordered, n = sorted(values), len(values)
    k = 1  # [k-th lowest, k-th highest] misses the median with chance 2 P(Binomial(n, 1/2) <= k - 1)
    while k + 1 <= (n + 1) // 2 and 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 1 - coverage:
        k += 1
    return ordered[k - 1], ordered[n - k]


def median_noise(samples: list[float]) -> float:
    """Relative standard error of a median: 1.2533 * sigma / sqrt(n), sigma from the MAD (robust)."""
    stats = summarize(samples)
    if not stats:
        return 0.0
    return 1.2533 * stats["relative_noise"] / math.sqrt(stats["n"])


def time_mark(use_events: bool) -> Any:
    """Now: a CUDA event recorded on the current stream (read later, so no host sync), or
    ``perf_counter`` seconds on CPU, where the work is synchronous."""
    if use_events:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds between two :func:`time_mark` results (waits for CUDA events to complete)."""
    if isinstance(start, float):
        return (end - start) * 1e3
    return start.elapsed_time(end)


def summarize(samples: list[float]) -> dict[str, float]:
    """Median, p90 and a noise estimate (median absolute deviation relative to the median)."""
    if not samples:
        return {}
    ordered = sorted(samples)
    median = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    mad = statistics.median(abs(x - median) for x in ordered)
    return {"median_ms": median, "p90_ms": p90, "relative_noise": (1.4826 * mad / median) if median else 0.0, "n": len(ordered)}
