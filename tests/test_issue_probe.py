"""The ISSUE probes' plumbing through a real fit: the run waits for the device before each ISSUE batch, times
from there to the next batch's start, hands that to the planner, drops a sample a validation interrupts, and
the report carries what the planner kept."""

from __future__ import annotations

import time

import pytest
import torch

from compile_callback import CompileCallback
from compile_callback import run as run_module
from compile_callback.planner import ISSUE_PROBES, AutoPlanner
from tests.conftest import TinyModel, loader, make_trainer

STEP_SLEEP_S = 0.03  # each training step: a sample is at least this
VALIDATION_SLEEP_S = 0.3  # each validation step: a sample across a validation would be at least this
DEVICE_WAIT_S = 0.02  # the stand-in synchronize's wait, which no sample may include


class TimedSteps(TinyModel):
    """Sleeps a known time in every step and records each training step's start and end (the run's clock)."""

    def __init__(self) -> None:
        super().__init__()
        self.train_steps: list[tuple[float, float]] = []
        self.validation_steps = 0

    def training_step(self, batch, batch_idx):
        started = time.perf_counter()
        time.sleep(STEP_SLEEP_S)
        loss = super().training_step(batch, batch_idx)
        self.train_steps.append((started, time.perf_counter()))
        return loss

    def validation_step(self, batch, batch_idx):
        self.validation_steps += 1
        time.sleep(VALIDATION_SLEEP_S)
        super().validation_step(batch, batch_idx)


@pytest.fixture
def issue_probes_first(monkeypatch):
    """The real AutoPlanner, its script opening with the real ``_time_issue`` (five ISSUE batches, then
    ``issue_ms``): on its own it probes only on CUDA, after a kept, launch-bound plan, which a CPU run never
    reaches. Only its device reads "cuda" while the probes run (nothing else of the planner reads it then);
    ``torch.cuda.synchronize``, which the run calls before each ISSUE batch, records its device and when it
    returned. Gives ``(planners, syncs)``."""
    planners, syncs = [], []
    script = AutoPlanner._run

    def probes_then_script(self):
        planners.append(self)
        device, self.device = self.device, torch.device("cuda")
        try:
            yield from self._time_issue()
        finally:
            self.device = device
        yield from script(self)

    def synchronize(device=None):
        time.sleep(DEVICE_WAIT_S)  # the device's queue draining
        syncs.append((device, time.perf_counter()))

    monkeypatch.setattr(AutoPlanner, "_run", probes_then_script)
    monkeypatch.setattr(run_module.torch.cuda, "synchronize", synchronize)
    return planners, syncs


def _fit(tmp_path, **trainer_kwargs):
    # 7 batches: the 5 ISSUE ones, the one whose start ends the last sample, one more (warm-up, profiling).
    callback = CompileCallback(backend="eager", eager_baseline_steps=2, warmup_steps=1, trial_steps=2, max_trials=1)
    model = TimedSteps()
    trainer = make_trainer(tmp_path, [callback], logger=False, limit_train_batches=7, num_sanity_val_steps=0,
                           **trainer_kwargs)
    trainer.fit(model, loader(batch_size=8), loader(batch_size=8))
    return callback.last_report, model


def _assert_each_sample_spans_its_batch(samples_ms, batches, model, syncs):
    """Sample of ISSUE batch k: at least batch k's training step (the run's clock starts before it), at most
    from the synchronize's return to batch k + 1's training step (it starts after the wait, stops before)."""
    for sample_ms, k in zip(samples_ms, batches, strict=True):
        started, ended = model.train_steps[k]
        assert sample_ms >= STEP_SLEEP_S * 1e3, (k, sample_ms)
        assert (ended - started) * 1e3 <= sample_ms <= (model.train_steps[k + 1][0] - syncs[k][1]) * 1e3, (
            k, sample_ms, model.train_steps, syncs)


def test_an_issue_sample_is_the_host_time_from_after_the_wait_to_the_next_batchs_start(tmp_path, issue_probes_first):
    planners, syncs = issue_probes_first
    report, model = _fit(tmp_path, limit_val_batches=0)
    (planner,) = planners
    assert len(model.train_steps) == 7
    # One wait for the device per ISSUE batch (batches 0-4), at that batch's start: after the batch before
    # it, before its own training step.
    assert [device for device, _ in syncs] == [torch.device("cpu")] * ISSUE_PROBES, syncs
    for k, (_, returned) in enumerate(syncs):
        assert (k == 0 or model.train_steps[k - 1][1] <= returned) and returned <= model.train_steps[k][0], (k, syncs)
    samples = planner.issue_samples_ms
    assert len(samples) == ISSUE_PROBES, samples
    _assert_each_sample_spans_its_batch(samples, range(ISSUE_PROBES), model, syncs)
    # The report carries the planner's samples and the quickest of them.
    plan = report["plan"]
    assert plan["host_issue_samples_ms"] == samples and plan["host_issue_ms"] == min(samples), plan


def test_a_validation_after_an_issue_batch_drops_that_batchs_sample(tmp_path, issue_probes_first):
    planners, syncs = issue_probes_first
    # Validation after every third batch: right after ISSUE batch 2, before batch 3 starts.
    report, model = _fit(tmp_path, limit_val_batches=1, val_check_interval=3)
    (planner,) = planners
    assert model.validation_steps >= 1 and len(model.train_steps) == 7
    assert len(syncs) == ISSUE_PROBES, syncs
    samples = planner.issue_samples_ms
    # Batch 2's time to batch 3's start held the validation: not counted, and no sample holds it.
    assert len(samples) == ISSUE_PROBES - 1, samples
    assert all(sample < VALIDATION_SLEEP_S * 1e3 for sample in samples), samples
    _assert_each_sample_spans_its_batch(samples, [0, 1, 3, 4], model, syncs)
    plan = report["plan"]
    assert plan["host_issue_samples_ms"] == samples and plan["host_issue_ms"] == min(samples), plan
