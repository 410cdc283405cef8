"""Re-pricing: eager timed again beside the kept plan, late in the run, so ``compile/speedup`` stays current.

A plan is priced by its trials, each against the plan before it in the same stretch of the run. On a
host-bound step that price goes stale: on the H200 the host's speed drifts over minutes and moves eager
and compiled steps by different amounts (ResNet-18 CIFAR: trials priced 2.84x at batch 100; eager and
compiled blocks taken in turn after batch 240 read 2.60x; timm ViT-B 1.36x against 1.22x). So once the
plan has frozen, at chosen batches, a round runs ABBA blocks (eager, compiled, compiled, eager; the
first step of each block not timed): eager by ``torch.compiler.set_stance("force_eager")`` for the
run's own modules and batches, no recompile. The round's ratio of medians becomes the speedup, and an
interval of its cycles' ratios (:func:`~compile_callback.timing.median_interval`) the uncertainty: where
their median lies, at least 90% sure from 5 cycles; below that their range, which holds it 50% (2 cycles),
75% (3) or 87.5% (4) of the time.

A round runs as many cycles as its extra time keeps within :data:`BUDGET` of the compiled time the run has
left (:func:`round_cycles`), from :data:`MIN_CYCLES` (which may cost more, as the first round always could)
to :data:`MAX_CYCLES`, and no more than the batches left hold. A host-bound step's eager time
moves between regimes tens of steps long (ResNet-18 CIFAR on the H200, 2026-12-04: eager blocks of one
A/B at 7.1, 8.1, 9.2 and 11.2 ms, compiled ones 2.9-3.5 ms), so a round of two cycles catches two or three
of them and its ratio lands where they fall; eight cycles average more of them, and the long runs that pay
for them are the ones whose figure a user reads most. A round the budget affords fewer cycles than the
round that prices the run is put off, not run: it would replace a steadier price with a noisier one
(a 5000-batch ResNet-18 CIFAR run's second round, two cycles at batch 2177 after four at 603, read 2.480x
against 2.620x from 32 cycles of eager and compiled blocks at the run's end).

Costs, kept small on purpose: a round's eager steps take longer than the plan's; the next round waits
until that excess is at most :data:`BUDGET` of the compiled time since (1%), and the first waits
:data:`FIRST_AFTER` batches after the plan froze. The latest round prices the run, so the budget decides
how stale that price is by the run's end: at 0.5% ResNet-18 CIFAR's next round came ~3,900 batches after
its first (at batch ~630), and in 3000-batch runs its one round read -6.4% to +9.6% from eager and
compiled blocks timed at the run's end, eager moving 8% in the minute between (H200, 2026-12-03; the
harness's own clock over the round's batches agreed with it within 1.4%); at 1% the next comes ~1,950
batches later after a round of two cycles, ~7,800 after one of eight. Rounds run only where batches come in
one shape (a mix would spread each block; several shapes are priced shape by shape already), and, for a plan of CUDA
graphs, only where the device has room for eager activations beside the graphs' pool (the memory rule
of issue 19); otherwise the trials' price stands and the report says why. Under DDP every rank runs the
same rounds (the schedule follows the batch index) and rank 0's ratio is everyone's.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from compile_callback.timing import median_interval, summarize

BLOCK = 4  # steps per block, the first not timed
MIN_CYCLES, MAX_CYCLES = 2, 8  # ABBA cycles per round (round_cycles)
BUDGET = 0.01  # a round's extra time (eager over compiled) as a share of the compiled time until the next
FIRST_AFTER = 500  # batches after the plan froze before the first round
EAGER, COMPILED = "reprice:eager", "reprice:compiled"  # the timer's labels of a round's timed steps


@dataclasses.dataclass
class Round:
    """One measured round: eager and compiled medians, their ratio, each cycle's ratio."""

    batch: int  # the batch the round ended at
    eager_ms: float
    compiled_ms: float
    cycles: list[float]
    eager_p90_ms: float | None = None  # of the same eager steps as eager_ms (the report's p90 beside it)

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.compiled_ms

    def interval(self) -> tuple[float, float]:
        """The speedup's uncertainty: an interval of the cycles' ratios (``compile/speedup_low``/``_high``)."""
        return median_interval(self.cycles)


def round_cycles(remaining: int, eager_ms: float | None, compiled_ms: float | None, *, budget: float = BUDGET) -> int:
    """How many ABBA cycles a round runs: as many as keep its extra time (two eager blocks a cycle, each
    ``eager_ms - compiled_ms`` a step over the plan) within ``budget`` of the compiled time of the
    ``remaining`` batches, from :data:`MIN_CYCLES` to :data:`MAX_CYCLES`; the fewest where a time is
    unknown. Never more than the ``remaining`` batches hold (fewer than :data:`MIN_CYCLES`: no round fits)."""
    remaining = max(0, remaining)
    fits = remaining // (4 * BLOCK)
    if not (eager_ms and compiled_ms):
        return min(fits, MIN_CYCLES)
    excess_ms = 2 * BLOCK * max(0.0, eager_ms - compiled_ms)
    paid = MAX_CYCLES if excess_ms == 0.0 else int(budget * remaining * compiled_ms // excess_ms)
    return min(fits, max(MIN_CYCLES, min(MAX_CYCLES, paid)))


class Repricer:
    """When a frozen plan's batches run eagerly to re-price it, and what the rounds found.

    The run asks :meth:`step` before each batch once the plan froze: ``None`` (a plain plan step),
    ``(eager, label)`` where ``label`` is the timer label (None: not timed) and ``eager`` whether the
    batch runs under ``force_eager``; where a round is :meth:`due` it asks :meth:`size` first. After a
    round's last batch it calls :meth:`finish` with the round's timed samples.
    """

    def __init__(self, *, first_after: int | None = None, budget: float | None = None) -> None:
        self.first_after = FIRST_AFTER if first_after is None else first_after
        self.budget = BUDGET if budget is None else budget
        self.next_at: int | None = None  # batch index of the next round's first batch
        self.rounds: list[Round] = []
        self._round_start: int | None = None
        self._started = 0  # rounds begun: each round's samples go under labels of their own
        self.skipped: str | None = None  # why rounds stopped (the report's note)
        self.cycles = MIN_CYCLES  # of the next (or current) round: set before it starts (round_cycles)

    @property
    def length(self) -> int:
        return 4 * self.cycles * BLOCK

    @property
    def running(self) -> bool:
        """Whether a round is under way."""
        return self._round_start is not None

    def plan_frozen(self, batch: int) -> None:
        if self.next_at is None:
            self.next_at = batch + self.first_after

    def due(self, batch: int) -> bool:
        """Whether a round would begin at ``batch`` (the run may still stop rounds first)."""
        return self._round_start is None and self.skipped is None and self.next_at is not None and batch >= self.next_at

    def size(self, batch: int, cycles: int) -> bool:
        """Sets the due round's cycles (:func:`round_cycles`); False, and the round put off by
        :attr:`first_after` batches, where they are fewer than :data:`MIN_CYCLES` (the run ends first) or
        than the round that prices the run ran: a noisier price would replace a steadier one (the budget
        affords fewer as the run's end nears)."""
        latest = self.latest()
        if cycles < MIN_CYCLES or (latest is not None and cycles < len(latest.cycles)):
            self.next_at = batch + self.first_after
            return False
        self.cycles = cycles
        return True

    def step(self, batch: int) -> tuple[bool, str | None] | None:
        """What batch ``batch`` is: None outside a round, else (runs eagerly, timer label or None)."""
        if self._round_start is None:
            if not self.due(batch):
                return None
            self._round_start = batch
            self._started += 1
        offset = batch - self._round_start
        if offset >= self.length:
            return None
        block, within = divmod(offset, BLOCK)
        eager = block % 4 in (0, 3)
        eager_label, compiled_label = self.labels()
        return eager, (None if within == 0 else eager_label if eager else compiled_label)

    def labels(self) -> tuple[str, str]:
        """The timer labels of the current (or last) round's eager and compiled steps."""
        return f"{EAGER}#{self._started}", f"{COMPILED}#{self._started}"

    def round_over(self, batch: int) -> bool:
        """Whether ``batch`` was a round's last."""
        return self._round_start is not None and batch - self._round_start == self.length - 1

    def finish(self, batch: int, eager: list[float], compiled: list[float]) -> Round | None:
        """Ends the round at ``batch`` from its timed samples, in order; schedules the next one."""
        self._round_start = None
        per_block = BLOCK - 1
        if len(eager) < 2 * self.cycles * per_block or len(compiled) < 2 * self.cycles * per_block:
            self.next_at = batch + self.first_after  # steps lost to compiles or sampling: try again later
            return None
        found = Round(batch, statistics.median(eager), statistics.median(compiled), [],
                      summarize(eager)["p90_ms"])
        for cycle in range(self.cycles):
            side = slice(2 * cycle * per_block, 2 * (cycle + 1) * per_block)
            found.cycles.append(statistics.median(eager[side]) / statistics.median(compiled[side]))
        self.rounds.append(found)
        # Each block's first step ran as its side ran, untimed: the timed excess, per timed step, for them too.
        excess_ms = max(0.0, sum(eager) - sum(compiled) * len(eager) / len(compiled)) * BLOCK / per_block
        self.next_at = batch + max(self.first_after, math.ceil(excess_ms / (self.budget * found.compiled_ms)))
        return found

    def stop(self, why: str) -> None:
        """No more rounds (the report says ``why``); a round under way ends unpriced."""
        self.skipped = why
        self._round_start = None

    def latest(self) -> Round | None:
        return self.rounds[-1] if self.rounds else None

    def plan_changed(self) -> None:
        """The plan the rounds priced changed (a region reverted or recompiled): their price is not its,
        and the next round, :attr:`first_after` batches on, may be of any size."""
        self.rounds = []
        self.next_at = None

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": [dataclasses.asdict(r) for r in self.rounds], "next_at": self.next_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = [Round(**r) for r in state.get("rounds", [])]
        self.next_at = state.get("next_at")
