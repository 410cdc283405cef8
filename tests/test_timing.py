"""StepTimer keys and settling, and the shape-by-shape speedup the planner's trials are judged by."""

import math
import statistics

import pytest
import torch

from compile_callback.timing import StepTimer, disturbed, median_interval, median_noise, paired_speedup


def test_windows_of_different_mixes_compare_like_with_like():
    before = {"short": [1.0], "long": [10.0, 10.0, 10.0]}  # median of all: 10
    after = {"short": [1.0, 1.0, 1.0], "long": [10.0]}  # median of all: 1, yet nothing got faster
    speedup, noise = paired_speedup(before, after)
    assert speedup == pytest.approx(1.0) and noise == 0.0
    faster = {"short": [0.5, 0.5, 0.5], "long": [5.0]}
    assert paired_speedup(before, faster)[0] == pytest.approx(2.0)
    # Weighted by the time the steps took: halving the long steps only counts for what they weigh.
    long_only_faster = {"short": [1.0, 1.0, 1.0], "long": [5.0]}
    assert paired_speedup(before, long_only_faster)[0] == pytest.approx(13.0 / 8.0)


def test_one_shape_is_the_ratio_of_medians_with_the_usual_noise():
    before = {None: [10.0, 11.0, 9.0]}
    after = {None: [5.0, 5.5, 4.5, 5.2]}
    speedup, noise = paired_speedup(before, after)
    assert speedup == pytest.approx(statistics.median(before[None]) / statistics.median(after[None]))
    # The ratio of two medians: both windows' relative standard errors, combined.
    assert noise == pytest.approx(math.hypot(median_noise(before[None]), median_noise(after[None])))


def test_shapes_timed_in_one_window_only_are_left_out():
    assert paired_speedup({"a": [2.0]}, {"b": [1.0]}) is None
    assert paired_speedup({"a": [2.0], "b": [4.0]}, {"a": [1.0], "c": [100.0]})[0] == pytest.approx(2.0)


def test_settle_drops_each_new_shapes_first_steps():
    timer = StepTimer(torch.device("cpu"))
    timer.settle("trial", 2)
    for key in ["a", "a", "a", "b", "a", "b", "b"]:
        timer.start()
        timer.stop("trial", key=key)
    assert {key: len(samples) for key, samples in timer.samples_by_key("trial").items()} == {"a": 2, "b": 1}
    assert timer.count("trial") == 3
    timer.start()
    timer.stop("other", key="a")  # settling is per label
    assert timer.count("other") == 1


def test_shapes_with_one_or_two_steps_do_not_hide_the_spread():
    before = {"a": [10.0, 11.0, 9.0, 10.5, 9.5], "b": [6.0]}
    after = {"a": [5.0, 5.5, 4.5, 5.2, 4.8], "b": [3.0]}
    _, noise = paired_speedup(before, after)
    # "b" sits on its own median: counted, it would make the steps look steadier than they are.
    assert noise == pytest.approx(math.hypot(median_noise(before["a"]), median_noise(after["a"])))


def test_last_takes_the_newest_samples_and_zero_takes_none():
    timer = StepTimer(torch.device("cpu"))
    for ms, key in ((1.0, "a"), (2.0, "b"), (3.0, "c")):
        timer._samples["x"].append((ms, key))
    assert timer.samples_by_key("x", last=2) == {"b": [2.0], "c": [3.0]}
    assert timer.samples_by_key("x", last=0) == {}
    assert timer.samples_by_key("x", last=10) == {"a": [1.0], "b": [2.0], "c": [3.0]}
    assert timer.median_ms("x", last=0) is None and timer.median_ms("x", last=2) == 2.5


def test_interleaved_blocks_put_a_steady_drift_on_both_sides_alike():
    import statistics

    from compile_callback.planner import candidate_block

    assert [candidate_block(b) for b in range(8)] == [True, False, False, True, True, False, False, True]
    # Steps that lengthen by 0.2 ms each (ever longer batches, a host slowing down), 4 blocks of 3 timed
    # steps, the same code on both sides: their medians agree, where alternating pairs favoured the first.
    times = [5.0 + 0.2 * i for i in range(12)]
    blocks = [times[3 * b:3 * b + 3] for b in range(4)]
    candidate = [t for b, ts in enumerate(blocks) if candidate_block(b) for t in ts]
    control = [t for b, ts in enumerate(blocks) if not candidate_block(b) for t in ts]
    assert statistics.median(control) / statistics.median(candidate) == pytest.approx(1.0)
    alternating = [t for b, ts in enumerate(blocks) if b % 2 == 1 for t in ts], [t for b, ts in enumerate(blocks) if b % 2 == 0 for t in ts]
    assert statistics.median(alternating[0]) / statistics.median(alternating[1]) > 1.05  # the old order's bias


def test_disturbed_sees_an_episode_that_slowed_part_of_a_window_and_not_a_quiet_one():
    quiet = [29.30, 29.35, 29.41, 29.33, 29.38, 29.32, 29.36, 29.40, 29.31, 29.34]  # ResNet-50 eager, H200
    assert not disturbed(quiet, tolerance=0.02)
    episode = quiet[:5] + [34.8, 37.2, 36.4, 35.1, 33.2]  # the same window, half of it during a host episode
    assert disturbed(episode, tolerance=0.02)
    assert not disturbed(quiet[:4] + [40.0], tolerance=0.02)  # too few steps to tell: not judged
    assert not disturbed(quiet + [60.0], tolerance=0.02)  # one slow step moves the median little


class _FakeEvent:
    """A CUDA event as StepTimer uses one, on CPU: ``record`` stamps the next tick of a shared clock."""

    clock = 0
    made = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        type(self).made += 1
        self.stamp: int | None = None
        self.stream = None

    def record(self, stream=None) -> None:
        type(self).clock += 1
        self.stamp, self.stream = type(self).clock, stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_FakeEvent") -> float:
        assert self.stamp is not None and end.stamp is not None and end.stamp > self.stamp, "a re-recorded pair"
        assert self.stream is end.stream, "the pair on different streams"
        return float(end.stamp - self.stamp)


def test_step_timer_reuses_read_events_and_never_one_still_pending(monkeypatch):
    """StepTimer's event pool on CPU (a fake event; the CUDA test runs on the GPU): each sample is the
    span of its own step however events are reused, discarded and settling steps give their start back,
    and a pool of one read's worth of events serves the whole run."""
    stream = object()
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    timer = StepTimer(torch.device("cuda"))
    assert timer.use_events
    timer.settle("work", 2)
    expected = []
    for step in range(300):
        timer.start()
        _FakeEvent.clock += step % 5  # the step's own length in ticks, beyond its end's record
        label = None if step % 7 == 0 else "work"
        timer.stop(label, key=step % 3)
        if label is not None and sum(1 for s in range(step + 1) if s % 7 and s % 3 == step % 3) > 2:
            expected.append(step % 5 + 1)
        if step % 10 == 9:
            timer.samples_ms("work")
        pending = [id(e) for item in timer._pending for e in item[2:]]
        assert len(set(pending)) == len(pending) and not set(pending) & {id(e) for e in timer._free_events}
    assert timer.samples_ms("work", wait=True) == expected
    assert _FakeEvent.made <= 2 * 10 + 2, _FakeEvent.made


def _fit_recording_batches(tmp_path, monkeypatch, callback, train_loader, *, max_steps: int) -> list[tuple]:
    """Fits TinyModel with ``callback`` and returns, for each batch in order, its planner label, whether its
    step was timed (the step timer started), and whether it compiled."""
    from compile_callback import run as run_module
    from tests.conftest import TinyModel, make_trainer

    seen: list[tuple] = []
    started: list[bool] = []
    start, after_batch = StepTimer.start, run_module.CompileRun.after_batch

    def counted_start(self):
        started.append(True)
        return start(self)

    def recorded_after_batch(self, batch, *, step):
        seen.append((self._label, bool(started), self.watch.compiled_since_collect))
        started.clear()
        return after_batch(self, batch, step=step)

    monkeypatch.setattr(StepTimer, "start", counted_start)
    monkeypatch.setattr(run_module.CompileRun, "after_batch", recorded_after_batch)
    make_trainer(tmp_path, [callback], max_epochs=-1, max_steps=max_steps).fit(TinyModel(), train_loader)
    return seen


def _timed_plan_steps(tmp_path, monkeypatch, train_loader, *, max_steps: int, baseline: int = 2) -> tuple[list[bool], object]:
    """Fits TinyModel with a fixed plan (its blocks, the eager backend) and returns, for each batch the
    plan ran compiled (a compiling one aside), whether its step was timed, in order; and the callback."""
    from compile_callback import CompileCallback
    from compile_callback.planner import COMPILED

    # anatomy=False, as on CUDA: the plan's steady steps are then quiet ones (CompileRun.quiet_step).
    callback = CompileCallback(["blocks.*"], backend="eager", eager_baseline_steps=baseline, warmup_steps=1, anatomy=False)
    seen = _fit_recording_batches(tmp_path, monkeypatch, callback, train_loader, max_steps=max_steps)
    return [timed for label, timed, compiled in seen if label == COMPILED and not compiled], callback


def test_the_frozen_plan_times_a_sample_of_its_steps_in_one_shape_and_every_step_in_several(tmp_path, monkeypatch):
    """The plan's steady steps cost a CUDA event pair each to time: in one shape they are timed on their
    first 32 and every 4th after (the steady step time needs no more); with several shapes, every one,
    so that no shape goes unsampled."""
    from compile_callback.run import PLAN_TIMED_EVERY, PLAN_TIMED_FIRST
    from tests.conftest import VariableBatchDataset, loader

    timed, callback = _timed_plan_steps(tmp_path / "one", monkeypatch, loader(batch_size=8), max_steps=140)
    assert len(timed) > 100, len(timed)
    expected = [n <= PLAN_TIMED_FIRST or n % PLAN_TIMED_EVERY == 0 for n in range(1, len(timed) + 1)]
    assert timed == expected
    assert callback.run.timer.median_ms("compiled") is not None  # the steady step time is still there
    assert callback.last_report["summary"]["speedup"] > 0

    monkeypatch.undo()
    several = torch.utils.data.DataLoader(VariableBatchDataset([8, 6, 4], repeats=4), batch_size=None)
    # A baseline long enough to see all three shapes (its first step is a warm-up).
    timed, callback = _timed_plan_steps(tmp_path / "several", monkeypatch, several, max_steps=100, baseline=7)
    assert len(callback.run.timer.keys(("eager",))) == 3
    assert len(timed) > 60 and all(timed), [n for n, t in enumerate(timed, 1) if not t]


def test_warm_up_batches_are_not_timed_and_the_eager_baseline_is(tmp_path, monkeypatch):
    """A warm-up batch's time is discarded (the first steps, the settling after a compile, and every batch that
    trains on while a background child compiles): it is not timed at all, which spared a CUDA event and a walk
    of the batch for its shapes each such batch. The eager baseline and the plan's first steps are."""
    from compile_callback import CompileCallback
    from compile_callback.planner import COMPILED, EAGER, WARMUP
    from tests.conftest import loader

    callback = CompileCallback(["blocks.*"], backend="eager", eager_baseline_steps=4, warmup_steps=3, anatomy=False)
    seen = [(label, timed) for label, timed, _ in
            _fit_recording_batches(tmp_path, monkeypatch, callback, loader(batch_size=8), max_steps=20)]
    labels = [label for label, _ in seen]
    assert labels[:3] == [WARMUP] * 3 and labels[3:7] == [EAGER] * 4 and labels.count(WARMUP) == 6  # 3 + 3 settling
    assert [timed for label, timed in seen if label == WARMUP] == [False] * 6
    assert all(timed for label, timed in seen if label == EAGER)
    assert any(timed for label, timed in seen if label == COMPILED) and callback.run.timer.median_ms(EAGER) is not None


def test_steady_steps_take_the_quiet_path_and_a_compile_in_one_is_still_recorded(tmp_path, monkeypatch):
    """Once the plan froze, its steady steps skip the hooks' bookkeeping (``CompileRun.quiet_step``): only
    sampled ones are timed. A recompile in such a step is still counted, with its region and step, as
    dynamo counts it, and the step after it takes the full path again."""
    from compile_callback import CompileCallback
    from compile_callback import run as run_module
    from tests.conftest import TinyModel, loader, make_trainer

    class Switching(TinyModel):
        """The head reads a Python flag that flips at global step 90: dynamo guards on it and recompiles."""

        def __init__(self):
            super().__init__()
            self.head.doubled = False

            def forward(x, head=self.head):
                return head.linear(x) * 2 if head.doubled else head.linear(x)

            self.head.forward = forward

        def training_step(self, batch, batch_idx):
            self.head.doubled = self.global_step >= 90
            return super().training_step(batch, batch_idx)

    paths: dict[int, str] = {}  # batch index -> "quiet" or "full"
    quiet_step, before_batch = run_module.CompileRun.quiet_step, run_module.CompileRun.before_batch

    def recorded_quiet_step(self):
        quiet = quiet_step(self)
        if quiet:
            paths[self.batch_index] = "quiet"
        return quiet

    def recorded_before_batch(self, module, **kwargs):
        paths[self.batch_index] = "full"
        return before_batch(self, module, **kwargs)

    monkeypatch.setattr(run_module.CompileRun, "quiet_step", recorded_quiet_step)
    monkeypatch.setattr(run_module.CompileRun, "before_batch", recorded_before_batch)
    torch._dynamo.utils.counters.clear()
    # anatomy=False: as on CUDA (sampled steps are never quiet); drop_last: batches in one shape.
    callback = CompileCallback(["head"], backend="eager", eager_baseline_steps=2, warmup_steps=1, anatomy=False,
                               log_every_n_steps=10)
    make_trainer(tmp_path, [callback], max_epochs=-1, max_steps=140).fit(Switching(), loader(batch_size=8, drop_last=True))

    assert sorted(paths) == list(range(140))
    quiet = [index for index, path in paths.items() if path == "quiet"]
    assert len(quiet) > 70, paths  # all but the baseline, the plan's first steps and any re-pricing round
    assert paths[90] == "quiet" and paths[91] == "full", (paths[90], paths[91])
    recompiles = [(r.region, r.stage, r.step) for r in callback.run.watch.recompiles]
    assert recompiles == [("head", "train", 90)], recompiles
    assert callback.last_report["summary"]["recompiles"] == 1


def test_the_interval_of_a_median_narrows_as_values_grow_where_their_range_widens():
    """Order statistics around the median: [k-th lowest, k-th highest] misses it with chance
    2 P(Binomial(n, 1/2) <= k - 1); k the largest keeping that at most 10%. Up to 7 values no k > 1 does
    (7: 2 x 8/128 = 12.5%), so the range; 8 drop one each side (2 x 9/256 = 7%), 12 two (2 x 79/4096 = 3.9%)."""
    assert median_interval([2.0]) == (2.0, 2.0)
    assert median_interval([3.0, 1.0]) == (1.0, 3.0)
    assert median_interval(list(range(1, 8))) == (1, 7)
    assert median_interval(list(range(8, 0, -1))) == (2, 7)
    assert median_interval(list(range(1, 13))) == (3, 10)
    assert median_interval(list(range(1, 13)), coverage=0.8) == (4, 9)  # 2 x 299/4096 = 14.6% <= 20%
    with pytest.raises(ValueError, match="at least one value"):
        median_interval([])
