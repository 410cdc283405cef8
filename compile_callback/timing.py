"""StepTimer: step times without a host sync per step.

On CUDA each step is bracketed by two CUDA events and read only once the end event has completed
(``Event.query()`` never blocks), so the training loop never waits on the timer. On CPU the work is
synchronous and ``time.perf_counter`` is exact.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque
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
        self._samples: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=self.keep))
        self._pending: deque[tuple[str, object, object]] = deque()
        self._started: object | None = None

    def start(self) -> None:
        self._started = time_mark(self.use_events)

    def stop(self, label: str | None) -> None:
        """Ends the step begun by :meth:`start`; ``label=None`` discards it (e.g. a step that compiled)."""
        started, self._started = self._started, None
        if started is None or label is None:
            return
        end = time_mark(self.use_events)
        if self.use_events:
            self._pending.append((label, started, end))
        else:
            self._samples[label].append(elapsed_ms(started, end))

    def _drain(self, *, wait: bool = False) -> None:
        while self._pending:
            label, start, end = self._pending[0]
            if not wait and not end.query():  # type: ignore[attr-defined]
                break
            if wait:
                end.synchronize()  # type: ignore[attr-defined]
            self._pending.popleft()
            self._samples[label].append(elapsed_ms(start, end))

    def samples_ms(self, label: str, *, wait: bool = False) -> list[float]:
        """Completed samples for ``label`` in milliseconds; ``wait=True`` waits for pending ones."""
        self._drain(wait=wait)
        return list(self._samples.get(label, ()))

    def median_ms(self, label: str, *, last: int | None = None, wait: bool = False) -> float | None:
        samples = self.samples_ms(label, wait=wait)
        if last is not None:
            samples = samples[-last:]
        return statistics.median(samples) if samples else None

    def count(self, label: str) -> int:
        return len(self._samples.get(label, ())) + sum(1 for item in self._pending if item[0] == label)



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
