"""Host syncs found by the anatomy: in the sampled step and between two steps, with real Trainers."""

from __future__ import annotations

import warnings

import pytest
import torch

from compile_callback import CompileCallback
from compile_callback.anatomy import PROGRESS_BAR_SITE, UNSEEN_SITE, HostSyncs, host_sync_advice
from tests.conftest import loader, make_trainer, read_scalars
from tests.test_anatomy import FAST, LossInForward


class Logged(LossInForward):
    """Logs its loss each step, to the progress bar or not; optionally reads values on the host."""

    def __init__(self, prog_bar: bool, item_in_step: bool = False, item_after_batch: bool = False) -> None:
        super().__init__()
        self.prog_bar = prog_bar
        self.item_in_step = item_in_step
        self.item_after_batch = item_after_batch
        self.seen: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = self(*batch)
        if self.item_in_step and loss.item() > 1e9:  # a host read of the loss: one sync per step
            raise RuntimeError("diverged")
        self.log("train/loss", loss, prog_bar=self.prog_bar)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.item_after_batch:
            self.seen.append(float(outputs["loss"]))  # the user's own read, after the callbacks' hooks


def fit(tmp_path, model, device: str = "cpu", **trainer_kwargs):
    # On CUDA the anatomy (and its host-sync probe) samples only when asked (anatomy=None: CPU only).
    callback = CompileCallback("model", backend="aot_eager", anatomy=True, **FAST)
    trainer = make_trainer(tmp_path, [callback], accelerator=device, **trainer_kwargs)
    trainer.fit(model, loader(batch_size=8))
    return callback.last_report


def test_progress_bar_metric_is_one_sync_between_steps(tmp_path):
    # log_every_n_steps=1 (the test Trainer's): the probed interval also flushes to the loggers, which
    # reads the same value again; that flush is periodic, not per step, and is not counted.
    report = fit(tmp_path, Logged(prog_bar=True))
    anatomy = report["anatomy"]
    assert anatomy["host_syncs_between_steps"] == 1
    assert anatomy["host_sync_sites"] == {PROGRESS_BAR_SITE: 1}
    assert anatomy["host_syncs_in_step"] == 0
    scalars = read_scalars(str(tmp_path))
    assert scalars["compile/anatomy/host_syncs_between_steps"][-1][1] == 1.0
    assert report["suggestions"] == []  # on a CPU a host read costs nothing extra: no advice


def test_no_progress_bar_metric_no_sync(tmp_path):
    anatomy = fit(tmp_path, Logged(prog_bar=False))["anatomy"]
    assert anatomy["host_syncs_between_steps"] == 0
    assert anatomy["host_sync_sites"] == {}
    assert anatomy["host_syncs_in_step"] == 0


def test_sync_in_training_step_is_counted_in_the_step(tmp_path):
    anatomy = fit(tmp_path, Logged(prog_bar=False, item_in_step=True))["anatomy"]
    assert anatomy["host_syncs_in_step"] == 1
    assert anatomy["host_syncs_between_steps"] == 0


def test_users_sync_after_the_batch_is_named_by_its_frame(tmp_path):
    anatomy = fit(tmp_path, Logged(prog_bar=True, item_after_batch=True))["anatomy"]
    assert anatomy["host_syncs_between_steps"] == 2
    sites = anatomy["host_sync_sites"]
    assert sites.pop(PROGRESS_BAR_SITE) == 1
    ((site, count),) = sites.items()
    assert count == 1 and "test_host_syncs.py" in site and site.endswith(": on_train_batch_end"), site


def test_anatomy_off_probes_nothing(tmp_path):
    callback = CompileCallback("model", backend="aot_eager", anatomy=False, **FAST)
    make_trainer(tmp_path, [callback]).fit(Logged(prog_bar=True), loader(batch_size=8))
    anatomy = callback.last_report["anatomy"]
    assert "host_syncs_between_steps" not in anatomy and "host_sync_sites" not in anatomy


def test_advice_names_the_cause_and_the_fix():
    sigterm = "lightning/pytorch/loops/training_epoch_loop.py(259): _broadcast_sigterm_tensor"
    syncs = HostSyncs(
        count=5, sites={"train.py(40): on_train_batch_end": 1}, lightning_sites={sigterm: 1}, progress_bar=1,
        unseen=2,
    )
    advice = host_sync_advice(syncs, 1)
    assert len(advice) == 5
    assert "prog_bar=False" in advice[0]
    assert "train.py(40): on_train_batch_end (x1)" in advice[1] and "sigterm" not in advice[1]
    assert advice[2].startswith("2 host read(s) between steps made inside another torch call")
    assert sigterm in advice[3] and "cannot turn these off" in advice[3]
    assert "1 tensor value(s)" in advice[4]
    assert syncs.all_sites() == {
        "train.py(40): on_train_batch_end": 1, sigterm: 1, PROGRESS_BAR_SITE: 1, UNSEEN_SITE: 2
    }
    assert host_sync_advice(HostSyncs(), 0) == []
    assert host_sync_advice(None, 0) == []


class FormatsAfterBatch(Logged):
    """Reads the loss inside another torch call (``Tensor.__format__``): no Python read of its own."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(f"{outputs['loss'].detach():.3f}")


def test_a_read_inside_another_torch_call_is_counted_as_unseen(tmp_path):
    anatomy = fit(tmp_path, FormatsAfterBatch(prog_bar=False))["anatomy"]
    assert anatomy["host_syncs_between_steps"] == 1
    assert anatomy["host_sync_sites"] == {UNSEEN_SITE: 1}


def test_auto_planning_is_not_disturbed_by_the_probe(tmp_path):
    """The probe ends before the planner acts: a trial's compile never sees the probe's mode."""
    callback = CompileCallback(
        "auto", backend="aot_eager", eager_baseline_steps=2, warmup_steps=1, trial_steps=3, max_trials=1
    )
    make_trainer(tmp_path, [callback], max_epochs=2).fit(Logged(prog_bar=True), loader(batch_size=8))
    report = callback.last_report
    assert report["summary"]["recompiles"] == 0, report["recompile_causes"]
    assert report["anatomy"]["host_syncs_between_steps"] == 1


class ValidationLoaderSpy:
    """A validation DataLoader that notes, each time its iterator is made, whether a probe runs."""

    def __init__(self, callback, loader_):
        self.callback, self.loader, self.seen = callback, loader_, []

    def __iter__(self):
        self.seen.append(self.callback.run.anatomy_ops.probe.active)
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)


def test_no_probe_runs_when_validation_starts(tmp_path):
    """Validation makes its DataLoader workers before any hook: a probe running then would be forked."""
    callback = CompileCallback("model", backend="aot_eager", **FAST)

    class Validated(Logged):
        def validation_step(self, batch, batch_idx):
            return None

    spy = ValidationLoaderSpy(callback, loader(batch_size=8))
    model = Validated(prog_bar=True)
    model.val_dataloader = lambda: spy
    # 12 batches an epoch, validation every 3: a sample ends right before several validation points
    trainer = make_trainer(tmp_path, [callback], max_epochs=3, val_check_interval=3, num_sanity_val_steps=0)
    trainer.fit(model, loader(batch_size=8))
    assert spy.seen and not any(spy.seen), spy.seen
    assert callback.last_report["anatomy"]["host_syncs_between_steps"] == 1


def test_the_callbacks_own_periodic_reads_are_not_reported(tmp_path):
    """With pad='auto' the callback reads its padding figures when it logs: not the user's to fix."""
    from tests.conftest import TokenModel, VarLenDataset

    callback = CompileCallback("model", backend="aot_eager", pad="auto", log_every_n_steps=1, **FAST)
    trainer = make_trainer(tmp_path, [callback], max_epochs=2)
    trainer.fit(TokenModel(), loader(VarLenDataset([5, 9, 13]), batch_size=4))
    anatomy = callback.last_report["anatomy"]
    assert anatomy["host_syncs_between_steps"] == 0, anatomy["host_sync_sites"]


@pytest.mark.cuda
def test_gpu_run_warns_once_and_suggests_the_fix(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit(tmp_path, Logged(prog_bar=True), device="gpu", max_epochs=2)
    ours = [w for w in caught if "host sync(s) between training steps" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "prog_bar=False" in str(ours[0].message)
    assert any("prog_bar=False" in s for s in report["suggestions"])
    assert report["anatomy"]["host_syncs_between_steps"] == 1


@pytest.mark.cuda
def test_gpu_run_without_syncs_gives_no_advice(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = fit(tmp_path, Logged(prog_bar=False), device="gpu")
    assert not [w for w in caught if "host sync" in str(w.message)]
    assert not [s for s in report["suggestions"] if "host" in s]
    assert report["anatomy"]["host_syncs_between_steps"] == 0


@pytest.mark.cuda
def test_gpu_sync_in_step_is_suggested(tmp_path):
    report = fit(tmp_path, Logged(prog_bar=False, item_in_step=True), device="gpu")
    assert report["anatomy"]["host_syncs_in_step"] == 1
    assert any("1 tensor value(s)" in s for s in report["suggestions"])


def test_a_fork_stops_a_running_probe():
    """DataLoader workers are forked: they must not inherit a running profiler or function mode."""
    import os

    from compile_callback.anatomy import BetweenStepsProbe

    from compile_callback import torch_internals

    probe = BetweenStepsProbe()
    depth = torch_internals.function_mode_depth()
    assert probe.start(name=True, device_type="cpu")
    try:
        assert torch_internals.function_mode_depth() == depth + 1 and torch_internals.profiler_running()
        pid = os.fork()
        if pid == 0:  # the child: neither the mode nor the profiler came along
            clean = torch_internals.function_mode_depth() == depth and not torch_internals.profiler_running()
            os._exit(0 if clean else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not probe.active and probe.aborted and probe.stop() is None
        assert torch_internals.function_mode_depth() == depth and not torch_internals.profiler_running()
    finally:
        probe.abort()


def test_a_fork_from_another_thread_only_spoils_the_probe():
    """The mode and the profiler belong to the thread that started them: a fork elsewhere must not
    touch them, only make the interval's result worthless."""
    import os
    import threading

    from compile_callback import torch_internals
    from compile_callback.anatomy import BetweenStepsProbe

    probe = BetweenStepsProbe()
    assert probe.start(name=True, device_type="cpu")
    try:
        def fork_and_wait():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)

        thread = threading.Thread(target=fork_and_wait)
        thread.start()
        thread.join()
        assert probe.active and probe.spoiled  # still running on its own thread, marked
        assert probe.stop() is None and not probe.active
        assert not torch_internals.profiler_running()
    finally:
        probe.abort()
