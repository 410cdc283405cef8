"""Measuring a variant: step times, wall time, tokens, recompiles per epoch, and the numbers derived from them.

One plain object, :class:`StepMeter`, does the measuring for both loops; two thin Lightning callbacks
call it from the Trainer's hooks (``StepStart`` first in the callback list and ``StepEnd`` last, so the
timed span holds every other callback's hooks too: the CompileCallback's own overhead is part of its
step time). The plain PyTorch loop calls the same methods directly.

Step time is forward + backward + optimizer step, timed with CUDA events on a GPU (read once, at the
end: no host sync per step) and ``time.perf_counter`` on CPU, where the work is synchronous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import resource
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from benchmarks import dynamo_counts
from compile_callback.timing import elapsed_ms, time_mark

H200_PEAK_BF16_FLOPS = 989e12  # dense bf16 tensor-core peak of an H100/H200 SXM, as in SPEC.md

TokenCount = tuple[int | torch.Tensor, int]  # (real tokens, all tokens) of one batch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (the same definition as compile_callback.timing.summarize)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


@dataclasses.dataclass
class InFitAB:
    """An A/B inside one fit, after its steady window: blocks of steps run eagerly and compiled in turn.

    Comparing two variants that ran minutes apart is only as good as the host's steadiness (on the shared
    H200 host an eager, host-bound step moves 10-30% over a run). Here the same fit, the same module
    and the same batches alternate between eager (``switch(True)``: the run's compiled code ignored,
    ``torch.compiler.set_stance("force_eager")``) and compiled (``switch(False)``) in blocks ordered
    ABBA (eager, compiled, compiled, eager, ...), so a steady drift lands on both sides alike. The first
    ``skip`` steps of each block are not counted (a switch's first step). The ratio is the harness's
    own, timed by the :class:`StepMeter`, never by the callback.

    Attributes:
        switch: ``eager -> None``, called before each block's first step and with False after the last.
        blocks: how many blocks (a multiple of 4: whole ABBA cycles).
        block_steps: steps per block, ``skip`` of them not counted.
        on_start: called once before the first block (what the record must read before the A/B runs:
            the callback's figures, the peak memory of the steady steps).
    """

    switch: Callable[[bool], None]
    blocks: int = 8
    block_steps: int = 10
    skip: int = 2
    on_start: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.blocks < 4 or self.blocks % 4:
            raise ValueError(f"an in-fit A/B needs whole ABBA cycles: blocks a multiple of 4; got {self.blocks}.")
        if not 0 <= self.skip < self.block_steps:
            raise ValueError(f"skip must be in 0..block_steps-1={self.block_steps - 1}; got {self.skip}.")

    def eager(self, block: int) -> bool:
        """Block ``block`` runs eagerly: blocks 0, 3, 4, 7, ... (ABBA)."""
        return block % 4 in (0, 3)

    @property
    def steps(self) -> int:
        return self.blocks * self.block_steps

    def summarize(self, step_ms: Sequence[float]) -> dict[str, Any]:
        """The A/B from the steps it timed, in order: medians of each side, the ratio, and the ratio of
        each ABBA cycle (their spread is the A/B's own noise)."""
        blocks = [list(step_ms[b * self.block_steps : (b + 1) * self.block_steps])[self.skip :] for b in range(self.blocks)]
        eager = [ms for b, samples in enumerate(blocks) if self.eager(b) for ms in samples]
        compiled = [ms for b, samples in enumerate(blocks) if not self.eager(b) for ms in samples]
        cycles = []
        for first in range(0, self.blocks, 4):
            cycle_eager = blocks[first] + blocks[first + 3]
            cycle_compiled = blocks[first + 1] + blocks[first + 2]
            if cycle_eager and cycle_compiled:
                cycles.append(statistics.median(cycle_eager) / statistics.median(cycle_compiled))
        eager_ms = statistics.median(eager) if eager else None
        compiled_ms = statistics.median(compiled) if compiled else None
        return {
            "eager_ms": eager_ms,
            "compiled_ms": compiled_ms,
            "speedup": speedup(eager_ms, compiled_ms),
            "cycle_speedups": cycles,
            "blocks": self.blocks,
            "block_steps": self.block_steps,
            "skipped_per_block": self.skip,
            "order": "ABBA (eager, compiled, compiled, eager)",
            "block_medians_ms": [statistics.median(samples) if samples else None for samples in blocks],
        }


def abba_ratios(walls: Sequence[float]) -> list[float]:
    """Each whole ABBA cycle's A blocks against its B blocks: ``(w0 + w3) / (w1 + w2)`` of blocks 0-3, 4-7, ..."""
    return [(walls[i] + walls[i + 3]) / (walls[i + 1] + walls[i + 2]) for i in range(0, len(walls) - 3, 4)
            if walls[i + 1] + walls[i + 2] > 0]


def block_walls(step_ends_s: Sequence[float], first: int, blocks: int, block_steps: int) -> list[float]:
    """The host's wall seconds of each block of ``block_steps`` steps after step ``first`` (1-based steps;
    ``step_ends_s[k]`` is step k+1's end), as far as the steps go."""
    walls = []
    for block in range(blocks):
        start, end = first + block * block_steps, first + (block + 1) * block_steps
        if start < 1 or end > len(step_ends_s):
            break
        walls.append(step_ends_s[end - 1] - step_ends_s[start - 1])
    return walls


@dataclasses.dataclass
class ChildPauseAB:
    """An experiment inside one fit (issue 22): what a CompileCallback's background child costs the training
    steps beside it, by stopping it.

    From step ``first`` on, the processes ``find()`` names (the callback's child or standby and their compile
    workers) are stopped (``SIGSTOP``) and continued (``SIGCONT``) in blocks of ``block_steps`` steps ordered
    ABBA (running, stopped, stopped, running, ...), so a host's drift lands on both sides alike; after the last
    block they run on. Each block's wall time (the host's clock at the steps' ends,
    :attr:`StepMeter.step_ends_s`) of the running blocks against the stopped ones is the child's cost to the
    training steps while it works, free of the 10-30% by which separate runs of these hosts move. Stopping the
    child delays its work, so the run's own figures (its first-1000 wall time) answer nothing.

    Attributes:
        find: ``() -> pids`` of the processes to stop, found anew at each stop (a child's compile workers come
            and go).
        blocks: how many blocks (a multiple of 4: whole ABBA cycles; 0: none).
        first: the steps ended before the first block.
        block_steps: steps a block.
    """

    find: Callable[[], list[int]]
    blocks: int
    first: int = 50  # after the hand-over (batch 16)
    block_steps: int = 25
    # {"step", "running", "processes", "seconds"} at each switch
    switches: list[dict[str, Any]] = dataclasses.field(default_factory=list, init=False)
    _stopped: list[int] = dataclasses.field(default_factory=list, init=False)

    @classmethod
    def within(cls, total_steps: int, find: Callable[[], list[int]]) -> ChildPauseAB:
        """The A/B with as many whole ABBA cycles of the default blocks as a run of ``total_steps`` steps holds."""
        return cls(find, blocks=max(0, (total_steps - cls.first) // (4 * cls.block_steps)) * 4)

    def __post_init__(self) -> None:
        if self.blocks < 0 or self.blocks % 4:
            raise ValueError(f"a child-pause A/B needs whole ABBA cycles: blocks a multiple of 4; got {self.blocks}.")
        if self.first < 1 or self.block_steps < 1:
            raise ValueError(f"first and block_steps must be at least 1; got {self.first} and {self.block_steps}.")

    def after_step(self, steps: int) -> None:
        """Called after each step with the steps ended so far: stops the processes at each pair of stopped
        blocks' start (blocks 1, 5, ...) and continues them at its end, and after the last block."""
        offset = steps - self.first
        if not self.blocks or offset < 0 or offset % self.block_steps or offset // self.block_steps > self.blocks:
            return
        block = offset // self.block_steps
        started = time.perf_counter()
        if block == self.blocks or block % 4 == 3:
            count = len(self._stopped)
            self.resume()
            running = True
        elif block % 4 == 1:
            for pid in self.find():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    self._stopped.append(pid)
            count, running = len(self._stopped), False
        else:
            return
        # The switch's own time (the stop's look through /proc: milliseconds) is taken out of its block's wall.
        self.switches.append({"step": steps, "running": running, "processes": count,
                              "seconds": round(time.perf_counter() - started, 6)})

    def resume(self) -> None:
        """Continues whatever is stopped (after a pair of stopped blocks, the fit's end, an error)."""
        for pid in self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._stopped = []

    def summarize(self, step_ends_s: Sequence[float]) -> dict[str, Any]:
        """The A/B from the steps' ends: each block's wall (less the switch at its start), each whole cycle's
        running / stopped ratio (only cycles whose stop found a process to stop count: before the child starts
        or after it ends nothing is stopped) and their median."""
        walls = block_walls(step_ends_s, self.first, self.blocks, self.block_steps)
        for switch in self.switches:
            block = (switch["step"] - self.first) // self.block_steps
            if block < len(walls):
                walls[block] -= switch.get("seconds", 0.0)
        stopped_any = {s["step"]: s["processes"] > 0 for s in self.switches if not s["running"]}
        cycles = abba_ratios(walls)
        counted = [ratio for cycle, ratio in enumerate(cycles)
                   if stopped_any.get(self.first + (4 * cycle + 1) * self.block_steps)]
        return {
            "first": self.first, "blocks": self.blocks, "block_steps": self.block_steps,
            "order": "ABBA (running, stopped, stopped, running)",
            "block_walls_s": [round(w, 5) for w in walls],
            "cycle_ratios": [round(r, 5) for r in counted],
            "ratio": statistics.median(counted) if counted else None,
            "cycles_without_a_process": len(cycles) - len(counted),
            "switches": self.switches,
        }


USAGE_EVERY = 100  # steps between readings of the training thread's usage (and at every wall step)


def main_thread_usage() -> tuple[float, int, int] | None:
    """This thread's CPU seconds (user and system) and its involuntary and voluntary context switches so far
    (None where the system keeps no per-thread figures): whether a slower run did more work on the training
    thread, or the same work pre-empted by other processes (involuntary switches) or waiting (voluntary)."""
    if not hasattr(resource, "RUSAGE_THREAD"):
        return None
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime, usage.ru_nivcsw, usage.ru_nvcsw


class StepMeter:
    """Times every step of one variant and keeps what the record needs.

    Args:
        device: where the steps run; CUDA is timed with events.
        total_steps: steps the variant runs; :meth:`step_end` returns True after the last one.
        measured_steps: the steady-state window, the last ``measured_steps`` steps.
        epoch_steps: steps per epoch, to count recompiles per epoch (None: one epoch).
        wall_steps: step counts at which the wall time since :meth:`begin` is taken (synchronized);
            ``total_steps`` is always one of them.
        count_tokens: ``batch -> (real tokens, all tokens)`` for token throughput and padding waste;
            called after the step's end is marked, so its work is not timed.
        settled: ``() -> bool``, asked after each step until it says True: whether that step ran the
            variant's final setup (a CompileCallback's frozen plan). The steady window is then the last
            ``measured_steps`` of the settled steps: a run that has not had that many by
            ``total_steps`` goes on, up to ``longest_steps``. None: every step counts as settled.
        longest_steps: the most steps a run waiting for ``settled`` may take (default ``total_steps``).
        in_fit_ab: an :class:`InFitAB` run after the steady window (its steps are timed apart: no other
            figure of the record includes them); None: none.

    Example:
        >>> meter = StepMeter(torch.device("cpu"), total_steps=10, measured_steps=5)
        >>> meter.begin()
        >>> for batch in batches:
        ...     meter.step_start(); train(batch); done = meter.step_end()
    """

    def __init__(
        self,
        device: torch.device,
        *,
        total_steps: int,
        measured_steps: int,
        epoch_steps: int | None = None,
        wall_steps: Sequence[int] = (1000,),
        count_tokens: Callable[[Any], TokenCount] | None = None,
        settled: Callable[[], bool] | None = None,
        longest_steps: int | None = None,
        in_fit_ab: InFitAB | None = None,
    ) -> None:
        if not 1 <= measured_steps <= total_steps:
            raise ValueError(f"measured_steps must be in 1..total_steps={total_steps}; got {measured_steps}.")
        if longest_steps is not None and longest_steps < total_steps:
            raise ValueError(f"longest_steps must be at least total_steps={total_steps}; got {longest_steps}.")
        self.device = device
        self.use_events = device.type == "cuda"
        self.total_steps = total_steps
        self.measured_steps = measured_steps
        self.epoch_steps = epoch_steps or total_steps
        self.wall_steps = sorted({s for s in wall_steps if s <= total_steps} | {total_steps})
        self.count_tokens = count_tokens
        self.settled = settled
        self.longest_steps = longest_steps or total_steps
        self.settled_at: int | None = None if settled is not None else 1  # the first settled step (1-based)
        self.steps = 0
        self._started_at: Any = None
        self._spans: list[tuple[Any, Any]] = []  # (start, end) time marks of each step
        self._tokens: list[TokenCount] = []
        self._wall_s: dict[int, float] = {}
        self._usage_at: dict[int, tuple[float, int, int]] = {}  # main_thread_usage() since begin(), every USAGE_EVERY steps
        self._usage_begun: tuple[float, int, int] | None = None
        self._recompiles_at_epoch_end: list[int] = []
        self._t0 = 0.0
        self._begun_at: float | None = None  # the wall clock at begin()
        self._ends_s: list[float] = []  # each step's end on the host, seconds after begin()
        self.final_loss: float | None = None
        self.in_fit_ab = in_fit_ab
        self._ab_spans: list[tuple[Any, Any]] = []  # the in-fit A/B's steps, timed apart
        self._ab_started = False

    def begin(self) -> None:
        """Starts the wall clock: call it right before the loop (or ``trainer.fit``)."""
        synchronize(self.device)
        self._t0 = time.perf_counter()
        self._begun_at = time.time()
        self._usage_begun = main_thread_usage()

    def step_start(self) -> None:
        self._started_at = time_mark(self.use_events)

    def step_end(self, *, batch: Any = None, loss: torch.Tensor | None = None) -> bool:
        """Ends the step begun by :meth:`step_start`; True when the variant has run all its steps."""
        if self._started_at is None:
            return self.steps >= self.total_steps
        if self._ab_started:
            return self._ab_step_end()
        self._spans.append((self._started_at, time_mark(self.use_events)))
        self._ends_s.append(time.perf_counter() - self._t0)  # the host's clock: lines steps up with other processes'
        self._started_at = None
        self.steps += 1
        if self.settled_at is None and self.settled is not None and self.settled():
            self.settled_at = self.steps
        if self.count_tokens is not None and batch is not None:
            self._tokens.append(self.count_tokens(batch))
        if self.steps % self.epoch_steps == 0:
            self._recompiles_at_epoch_end.append(dynamo_counts.recompile_count())
        if self.steps in self.wall_steps:
            synchronize(self.device)
            self._wall_s[self.steps] = time.perf_counter() - self._t0
        if self.steps in self.wall_steps or self.steps % USAGE_EVERY == 0:  # no sync needed: the thread's own clock
            usage = main_thread_usage()
            if usage is not None and self._usage_begun is not None:
                self._usage_at[self.steps] = tuple(now - then for now, then in zip(usage, self._usage_begun))  # type: ignore[assignment]
        done = self._done()
        if done and loss is not None:
            # Read now: a CUDA-graph output is overwritten by the next replay.
            self.final_loss = float(loss.detach().float())
        if done and self.in_fit_ab is not None:
            self._ab_started = True
            if self.in_fit_ab.on_start is not None:
                self.in_fit_ab.on_start()
            self.in_fit_ab.switch(self.in_fit_ab.eager(0))
            return False
        return done

    def _ab_step_end(self) -> bool:
        ab = self.in_fit_ab
        assert ab is not None
        self._ab_spans.append((self._started_at, time_mark(self.use_events)))
        self._started_at = None
        taken = len(self._ab_spans)
        if taken >= ab.steps:
            ab.switch(False)
            return True
        if taken % ab.block_steps == 0:
            ab.switch(ab.eager(taken // ab.block_steps))
        return False

    def _done(self) -> bool:
        if self.steps >= self.longest_steps:
            return True
        if self.steps < self.total_steps:
            return False
        return self.settled_at is not None and self.steps - self.settled_at + 1 >= self.measured_steps

    def window_settled(self) -> bool:
        """Whether every step of the steady window ran after :attr:`settled` turned true."""
        return self.settled_at is not None and self.settled_at <= self.steps - self.measured_steps + 1

    def step_ms(self) -> list[float]:
        synchronize(self.device)
        return [elapsed_ms(start, end) for start, end in self._spans]

    def result(self) -> dict[str, Any]:
        """Step-time statistics over the steady window, wall times, tokens and recompiles per epoch."""
        step_ms = self.step_ms()
        steady = step_ms[-self.measured_steps :]
        record: dict[str, Any] = {
            "steps_run": self.steps,
            "steps_measured": len(steady),
            "median_ms": statistics.median(steady) if steady else None,
            "p90_ms": percentile(steady, 0.9) if steady else None,
            "mean_ms": statistics.fmean(steady) if steady else None,
            "first_step_ms": step_ms[0] if step_ms else None,
            "wall_s_at_step": {str(k): v for k, v in sorted(self._wall_s.items())},
            "wall_first_steps_s": self._wall_s.get(self.total_steps),
            # The training thread over the same steps: CPU seconds, involuntary and voluntary context switches.
            "main_thread_at_step": {str(k): {"cpu_s": round(v[0], 4), "involuntary_switches": v[1], "voluntary_switches": v[2]}
                                    for k, v in sorted(self._usage_at.items())},
            "final_loss": self.final_loss,
            "recompiles_per_epoch": _per_epoch(self._recompiles_at_epoch_end),
            "step_ms_all": [round(ms, 3) for ms in step_ms],
            # Each step's end as the host issued it: the wall clock at begin() and seconds since (a background
            # child's stages, on the wall clock, fall on steps by these).
            "begun_at": self._begun_at,
            "step_ends_s": [round(s, 4) for s in self._ends_s],
            "settled_at_step": self.settled_at,
            "window_settled": self.window_settled(),
        }
        if self.in_fit_ab is not None and self._ab_spans:
            synchronize(self.device)
            ab_ms = [elapsed_ms(start, end) for start, end in self._ab_spans]
            record["in_fit_ab"] = {**self.in_fit_ab.summarize(ab_ms), "steps_run": len(ab_ms),
                                   "step_ms_all": [round(ms, 3) for ms in ab_ms]}
        if self._tokens:
            real = _to_ints([t[0] for t in self._tokens])
            total = [t[1] for t in self._tokens]
            steady_real = sum(real[-len(steady) :])
            steady_seconds = sum(steady) / 1e3
            record["tokens_per_s"] = steady_real / steady_seconds if steady_seconds > 0 else None
            record["real_tokens"] = sum(real)
            record["all_tokens"] = sum(total)
            record["padding_waste"] = 1.0 - sum(real) / sum(total) if sum(total) else None
        return record


def _to_ints(values: list[int | torch.Tensor]) -> list[int]:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [int(v) for v in values]
    # One transfer for the whole run instead of one host sync per step.
    read = iter(torch.stack([t.reshape(()) for t in tensors]).tolist())
    return [int(next(read)) if isinstance(v, torch.Tensor) else int(v) for v in values]


def _per_epoch(cumulative: list[int]) -> list[int]:
    return [now - before for before, now in zip([0, *cumulative[:-1]], cumulative)]


def mfu(tokens_per_s: float | None, flops_per_token: float | None, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization: achieved model FLOP/s over the hardware's peak (None when unknown)."""
    if not tokens_per_s or not flops_per_token or not peak_flops:
        return None
    return tokens_per_s * flops_per_token / peak_flops


def speedup(eager_ms: float | None, variant_ms: float | None) -> float | None:
    if not eager_ms or not variant_ms or not math.isfinite(eager_ms) or not math.isfinite(variant_ms):
        return None
    return eager_ms / variant_ms


# -- Lightning adapters ---------------------------------------------------------------------------
class StepStart(Callback):
    """Starts the meter's step; goes first in the Trainer's callback list."""

    def __init__(self, meter: StepMeter) -> None:
        self.meter = meter

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self.meter.step_start()


class StepEnd(Callback):
    """Ends the meter's step and stops the Trainer after the last one; goes last in the callback list.

    The Trainer is given a longer ``max_steps`` (the run the CompileCallback plans for) and stopped
    here through the public ``trainer.should_stop``.
    """

    def __init__(self, meter: StepMeter) -> None:
        self.meter = meter

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if self.meter.step_end(batch=batch, loss=loss if isinstance(loss, torch.Tensor) else None):
            trainer.should_stop = True


class ChildPauses(Callback):
    """Drives a :class:`ChildPauseAB` from the Trainer's hooks; goes after the meter's ``StepEnd``. Whatever is
    stopped when the fit ends or fails is continued by the runner (``ChildPauseAB.resume`` after the fit)."""

    def __init__(self, pauses: ChildPauseAB) -> None:
        self.pauses = pauses
        self.steps = 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.steps += 1
        self.pauses.after_step(self.steps)
