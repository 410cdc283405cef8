"""Background compiles (issue 22, item 3): a child process compiles the candidate while training goes on,
and every way that can fail leaves the trial compiling in-process, the run intact, the reason reported."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import subprocess
import sys
import time

import lightning as L
import pytest
import torch
import torch._dynamo
from torch import nn

from compile_callback import CompileCallback, background, boot
from compile_callback.background import policy
from compile_callback.regions import CompileOptions
from compile_callback.report import render_markdown
from tests.conftest import FasterCompiled, TinyModel, loader, make_trainer

STEPS = 200


def _fit(tmp_path, model, backend="eager", callbacks=()):
    callback = CompileCallback(backend=backend, background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=1)
    trainer = make_trainer(tmp_path, [*callbacks, callback], max_steps=STEPS, max_epochs=100, limit_val_batches=0)
    trainer.fit(model, loader(batch_size=8))
    assert trainer.global_step == STEPS and model.batches_seen == STEPS  # no batch lost or repeated
    decisions = callback.last_report["decisions"]
    assert [d["region"] for d in decisions] == ["model"]
    return callback, decisions[0]


@pytest.mark.slow
def test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly(tmp_path, monkeypatch):
    standbys, at_fit_start = [], []
    monkeypatch.setattr(background, "Standby", _recorded(background.Standby, standbys))
    monkeypatch.setattr(background, "bytecode_unwritten", lambda: False)  # no bytecode for a standby to write

    class BeforeFitStart(L.Callback):  # listed first: its on_fit_start runs before the CompileCallback's
        def on_fit_start(self, trainer, pl_module):
            at_fit_start.append(len(standbys))

    model = FasterCompiled()
    callback, decision = _fit(tmp_path, model, callbacks=[BeforeFitStart()])
    # The first child's interpreter started at the fit's setup, its imports beside the fit's own start, with
    # the module of the LightningModule's class to import while it waits.
    assert at_fit_start == [1] and standbys[0].process.args[-1] == FasterCompiled.__module__
    assert decision["background"].startswith("prepared in the background: the child compiled and checked it in")
    # Its seconds as a number too (the harness counts them as compiling), as the text says them.
    assert f" in {decision['background_s']:.1f} s (" in decision["background"]
    # Below the run's CPU priority (its compile takes the cores training leaves idle), as the child read it,
    # on the interpreter started with the fit (its start and imports out of the child's way).
    niceness = min(19, os.nice(0) + background.CHILD_NICENESS)
    assert decision["background"].endswith(f" in all, at niceness {niceness}; its interpreter started with the fit)"), decision
    # One candidate and no other child to follow it whatever its outcome: no interpreter readied for a next one
    # (it would import beside this one and beside training, for nothing).
    [standby] = standbys
    assert standby.process.poll() == 0 and not os.path.exists(standby.log)  # it exited of itself, its log read and gone
    # Where the child's time went, though it verified nothing that stands here: each stage, and together no
    # more than the child's whole life (its start-up counted from the spawn).
    child = {k.removeprefix("in the child: "): v for k, v in decision["setup_s"].items() if k.startswith("in the child: ")}
    assert {"start-up (interpreter and imports)", "loading (unpickling, to the device)", "eager", "compiled"} <= set(child)
    assert all(v > 0 for v in child.values()) and sum(child.values()) <= decision["background_s"] + child["start-up (interpreter and imports)"] + 1.0
    assert decision["kept"] and decision["verified"] is True
    # The "eager" backend fills no Inductor cache, so the trial's compile is not the child's: it verified here.
    assert not decision["error_in"].endswith("verified in the background child") and "eager" in decision["setup_s"]
    # While the child compiled (a fresh interpreter: seconds), training went on eagerly: each such
    # batch ran the model's Python forward (100 ms of sleep each), far more than the trial's own.
    assert model.eager_forwards > 30
    assert not any("compiling in the background" in note for note in callback.last_report["plan"]["notes"])
    assert "; prepared in the background: the child compiled" in render_markdown(callback.last_report)
    # A part the search never reached has no held input (it is held in the batch before its trial), yet it
    # would be compiled in a child all the same: its compile is priced as one.
    planner = callback.run.planner
    part = next(c for c in planner._all_candidates if c.name == "blocks.*")
    assert part.region.module_names[0] not in planner.profiler.held_inputs
    assert planner._in_background(part.region, part.units) == (True, None)


@pytest.mark.slow
def test_batches_trained_while_the_child_compiles_poll_it_only_every_so_often(tmp_path, monkeypatch):
    """While a child compiles, a batch takes the hooks' full path (the planner, which polls the child) only
    ``WAITING_POLL_S`` after the last batch that did; the others are quiet (``CompileRun.quiet_step``: 39 ->
    16 us a batch on a 2-core CPU). The child's end is still seen, and the trial follows."""
    from compile_callback import run as run_module

    monkeypatch.setattr(run_module, "WAITING_POLL_S", 0.25)  # FasterCompiled's eager batches take 100 ms each
    # Each batch: (index, when its quiet_step was asked, whether it was quiet, the last full batch's start, whether a
    # child compiled then); a batch's full path starts with before_batch, which sets that start.
    batches: list[tuple[int, float, bool, float, bool]] = []
    quiet_step = run_module.CompileRun.quiet_step

    def recorded_quiet_step(self):
        asked, last_full = time.perf_counter(), self._full_at
        quiet = quiet_step(self)
        batches.append((self.batch_index, asked, quiet, last_full, self.planner.compiling_in_background is not None))
        return quiet

    monkeypatch.setattr(run_module.CompileRun, "quiet_step", recorded_quiet_step)
    callback = CompileCallback(backend="eager", background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=1, anatomy=False)  # anatomy: as on CUDA, else never quiet
    trainer = make_trainer(tmp_path, [callback], max_steps=STEPS, max_epochs=100, limit_val_batches=0)
    model = FasterCompiled()
    trainer.fit(model, loader(batch_size=8))
    assert trainer.global_step == STEPS and model.batches_seen == STEPS
    [decision] = callback.last_report["decisions"]
    assert decision["background"].startswith("prepared in the background: the child compiled") and decision["kept"]
    waiting = [batch for batch in batches if batch[4]]  # the hand-over's own batch is not one
    assert len(waiting) > 30  # a fresh interpreter's imports: seconds of 100 ms batches
    for index, asked, quiet, last_full, _ in waiting:
        if quiet:  # within WAITING_POLL_S of the last full batch (asked a moment before quiet_step looked)
            assert asked - last_full < 0.25, (index, asked - last_full)
        else:  # polled the child: WAITING_POLL_S or more after the last (5 ms: quiet_step looked a moment later)
            assert asked - last_full >= 0.245, (index, asked - last_full)
    quiet = [index for index, _, was_quiet, _, _ in waiting if was_quiet]
    assert len(quiet) >= len(waiting) // 3, (len(quiet), len(waiting))
    # The last batch a child compiled in was a full one: its poll found the child done and the trial began there.
    assert not waiting[-1][2]
    assert not next(batch for batch in batches if batch[0] == waiting[-1][0] + 1)[4]


def test_a_fit_that_ends_while_the_child_compiles_trains_eagerly_and_leaves_no_child(tmp_path, monkeypatch):
    started = []
    real_start = background.start

    def start(*args, **kwargs):
        started.append(real_start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(background, "start", start)
    model = FasterCompiled()
    callback = CompileCallback(backend="eager", background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=1)
    class StopAt12(L.Callback):  # a run planned for STEPS batches, stopped early (early stopping, a time limit)
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.global_step >= 12

    # 12 batches of 100 ms: the fit ends long before a fresh interpreter has even imported torch.
    trainer = make_trainer(tmp_path, [callback, StopAt12()], max_steps=STEPS, max_epochs=100, limit_val_batches=0)
    trainer.fit(model, loader(batch_size=8))
    assert trainer.global_step == 12 and model.eager_forwards >= 12  # every batch trained, eagerly
    report = callback.last_report
    assert report["decisions"] == [] and report["summary"]["graphs"] == 0
    note = next(n for n in report["plan"]["notes"] if "was compiling in the background" in n)
    assert "`background_compile=False` compiles in-process instead" in note
    # The child was stopped at the fit's end and its files removed.
    [child] = started
    assert child.process.poll() is not None
    assert not os.path.exists(child.payload) and not os.path.exists(child.log)


class StuckInChildsEager(FasterCompiled):
    """Its eager forward in any other process than the one that made it (a background child's eager run, the
    first of its verification) takes a minute: a child that stays in its "eager" stage."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.made_in = os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != self.made_in and not torch.compiler.is_compiling():
            time.sleep(60)
        return super().forward(x)


@pytest.mark.slow
def test_a_report_made_while_the_child_compiles_says_which_stages_it_has_started(tmp_path):
    callback = CompileCallback(backend="eager", background_compile=True, eager_baseline_steps=2, warmup_steps=1,
                               trial_steps=4, max_trials=1)
    seen = []

    class StopInChildsEager(L.Callback):  # ends the fit once the child is in its eager run, or after 60 s of batches
        def on_train_batch_end(self, trainer, *args):
            seen.append(callback.run.planner.background_progress())
            stages = [s["stage"] for s in (seen[-1] or {}).get("stages", [])]
            trainer.should_stop = "eager" in stages or trainer.global_step >= 600

    trainer = make_trainer(tmp_path, [callback, StopInChildsEager()], max_steps=STEPS * 10, max_epochs=100,
                           limit_val_batches=0)
    started = time.time()
    trainer.fit(StuckInChildsEager(), loader(batch_size=8))
    assert trainer.global_step < 600, "the child never started its eager run"
    first = next(i for i, progress in enumerate(seen) if progress is not None)
    assert all(progress is not None for progress in seen[first:])  # from the hand-over to the fit's end
    progress = callback.last_report["plan"]["compiling_in_background"]
    assert progress["region"] == "model" and progress["since_batch"] == first  # the batch that handed it over
    # In the order the child started them, each on the wall clock after the hand-over and within the fit.
    assert [s["stage"] for s in progress["stages"]] == ["loading (unpickling, to the device)", "eager"]
    times = [progress["sent_at"]] + [s["at"] for s in progress["stages"]]
    assert started < times[0] and times == sorted(times) and times[-1] < time.time()
    assert all(s["after_s"] == pytest.approx(s["at"] - progress["sent_at"], abs=1e-3) for s in progress["stages"])
    note = next(n for n in callback.last_report["plan"]["notes"] if n.startswith("the background child of `model`"))
    assert f"eager at {progress['stages'][1]['after_s']:.1f} s" in note and "(the last still running)" in note
    assert callback.run.planner.background_progress() is None  # the child stopped with the fit


def _recorded(cls, made):
    """``cls``, each instance also appended to ``made``."""

    class Recorded(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    return Recorded


@pytest.mark.slow
def test_a_standby_that_is_gone_leaves_the_child_to_a_fresh_interpreter(tmp_path, monkeypatch):
    standbys = []
    monkeypatch.setattr(background, "Standby", _recorded(background.Standby, standbys))

    def die_first(self, payload):  # as a standby killed while it waited (out of memory, a user's pkill)
        self.process.kill()
        self.process.wait()
        return real_go(self, payload)

    real_go = background.Standby.go
    monkeypatch.setattr(background.Standby, "go", die_first)
    _, decision = _fit(tmp_path, FasterCompiled())
    assert decision["background"].startswith("prepared in the background: the child compiled and checked it in")
    assert "its interpreter started with the fit" not in decision["background"]  # a fresh one did it
    [standby] = standbys
    assert not os.path.exists(standby.log)  # the dead standby's log went with it


class Unpicklable(FasterCompiled):
    def __init__(self) -> None:
        super().__init__()
        self.scale = lambda x: x  # a lambda does not pickle: the child cannot get the module


def test_a_module_that_does_not_pickle_is_compiled_in_process(tmp_path, monkeypatch):
    import tempfile

    standbys = []
    monkeypatch.setattr(background, "Standby", _recorded(background.Standby, standbys))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the child's payload would go
    os.makedirs(tempfile.tempdir)
    _, decision = _fit(tmp_path, Unpicklable())
    assert decision["background"].startswith("not prepared in the background: the module does not pickle")
    assert decision["kept"]  # the trial went on as without a background compile
    # No half-written payload, and the standby that waited for it ended with its log.
    assert not any(name.startswith("compile-callback-") for name in os.listdir(tempfile.tempdir))
    [standby] = standbys
    assert standby.process.poll() is not None


def test_a_standby_never_told_to_go_ends_when_the_search_does(tmp_path, monkeypatch):
    # A plan without a child (a fixed-size run too short to repay one, or every candidate priced in-process):
    # the interpreter started with the fit goes when the plan freezes, not at the fit's end.
    from compile_callback import payback

    standbys, frozen_at = [], []
    monkeypatch.setattr(background, "Standby", _recorded(background.Standby, standbys))
    monkeypatch.setattr(payback, "BACKGROUND_MIN_COMPILE_S", float("inf"))  # every compile stays in-process

    class WatchStandby(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if callback.run.planner.frozen and not frozen_at:
                frozen_at.append(standbys[0].process.poll())

    callback = CompileCallback(backend="eager", eager_baseline_steps=2, warmup_steps=1, trial_steps=4, max_trials=1)
    monkeypatch.setattr(background, "policy", lambda *args, **kwargs: None)  # on, as on a GPU by default
    trainer = make_trainer(tmp_path, [callback, WatchStandby()], max_steps=60, max_epochs=100, limit_val_batches=0)
    trainer.fit(FasterCompiled(), loader(batch_size=8))
    (decision,) = callback.last_report["decisions"]
    assert decision["background"] is None and decision["kept"]  # compiled in-process, no child
    [standby] = standbys
    assert frozen_at and frozen_at[0] is not None  # ended at the freeze, before the fit's end
    assert not os.path.exists(standby.log)


def test_a_standby_imports_what_it_is_given_and_a_module_it_cannot_import_is_only_noted():
    standby = background.Standby(("json", "no_such_module_for_a_standby"))
    standby.process.stdin.close()  # no payload: once its imports are done it reads nothing and ends
    assert standby.process.wait(timeout=120) == 0
    with open(standby.log) as log:
        assert "preloading no_such_module_for_a_standby failed: ModuleNotFoundError" in log.read()
    standby.stop()
    assert not os.path.exists(standby.log)


def test_children_cache_bytecode_of_their_own_only_where_none_is_written(tmp_path, monkeypatch):
    env = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/home/u"}
    # The H200's host: no bytecode written, none set aside, none installed with torch. Every child reads
    # from the folder; only one off the critical path writes to it.
    reads = background.bytecode_env(env, installed=False, write=False)
    assert reads == {**env, "PYTHONPYCACHEPREFIX": background.BYTECODE_DIR}
    writes = background.bytecode_env(env, installed=False, write=True)
    assert writes == {"HOME": "/home/u", "PYTHONPYCACHEPREFIX": background.BYTECODE_DIR}
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # the run's own environment untouched
    assert background.bytecode_env({"HOME": "/home/u"}, installed=False, write=True) == {"HOME": "/home/u"}  # its own
    assert background.bytecode_env(env, installed=True, write=True) == env  # a prefix would hide torch's bytecode
    users = {**env, "PYTHONPYCACHEPREFIX": "/cache/pyc"}
    assert background.bytecode_env(users, installed=False, write=True) == users  # the user's folder, inherited
    # A fit's first standby reads; the next, started while a child compiles, writes (here none is written yet).
    monkeypatch.setattr(background, "BYTECODE_DIR", str(tmp_path / "pyc"))
    monkeypatch.setattr(boot, "WORKERS", 1)  # no compiling ahead: nothing runs here
    seen = []

    class Recorded:
        def __init__(self, args, **kwargs):
            seen.append(kwargs["env"])
            self.stdin = None

        def poll(self):
            return 0

    monkeypatch.setattr(background.subprocess, "Popen", Recorded)
    monkeypatch.setattr(background, "_installed_bytecode", lambda: False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    first = background.Standby(("json",))
    monkeypatch.setattr(background, "start", lambda *args, **kwargs: type("Child", (), {"standby": True})())
    launcher = background.Launcher(standby=first)
    launcher("model", None, None, None)
    assert [e.get("PYTHONDONTWRITEBYTECODE") for e in seen] == ["1", None]
    assert all(e["PYTHONPYCACHEPREFIX"] == background.BYTECODE_DIR and e["PYTHONPATH"] for e in seen)
    assert launcher.standby.preload == ("json",)
    for standby in (first, launcher.standby):
        os.remove(standby.log)


def test_the_next_childs_interpreter_is_readied_only_where_it_will_be_used_or_writes_bytecode(tmp_path, monkeypatch):
    """Handing a child over started the next child's interpreter every time: beside the first child's imports
    and beside training, for a second child the usual search never hands over (ResNet-18 CIFAR, ResNet-50: the
    whole model, kept). It starts where another child follows whatever this one's outcome (a part prepared
    before the whole model), or where it writes the bytecode later fits' children read; else a later child,
    if any, starts fresh."""
    readied = []

    class Quiet:  # what the launcher starts for the next child, nothing run
        precompiles = False

        def __init__(self, preload=(), *, write_bytecode=False, started="with the fit"):
            self.preload = tuple(preload)
            readied.append(write_bytecode)

        def stop(self):
            pass

    monkeypatch.setattr(background, "Standby", Quiet)
    monkeypatch.setattr(background, "start", lambda *args, standby=None, **kwargs:
                        type("Child", (), {"standby": standby is not None})())
    for another, unwritten, expected in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(background, "bytecode_unwritten", lambda unwritten=unwritten: unwritten)
        launcher = background.Launcher(standby=Quiet(("json",)))
        readied.clear()
        launcher("model", None, None, None, another=another)
        assert readied == ([True] if expected else []), (another, unwritten)
        assert (launcher.standby is not None) == expected and (not expected or launcher.standby.preload == ("json",))
    # The child handed over is compiling torch's sources into the folder itself (compile_callback.boot): a
    # second writer would compile the same sources at once beside it and training (session 43: 18 processes,
    # the steps beside them 1.154x slower), so none is readied for that; one the search will use still is.
    for another, expected in ((False, []), (True, [True])):
        monkeypatch.setattr(background, "bytecode_unwritten", lambda: True)
        handed = Quiet(("json",))
        handed.precompiles = True
        launcher = background.Launcher(standby=handed)
        readied.clear()
        launcher("model", None, None, None, another=another)
        assert readied == expected and (launcher.standby is not None) == another, another
    launcher = background.Launcher(standby=None)  # no standby to begin with (ranks but rank 0): none readied
    readied.clear()
    launcher("model", None, None, None, another=True)
    assert readied == [] and launcher.standby is None
    # Unwritten: children read from a folder of their own (no bytecode written here, none installed) that
    # lacks torch's; written once torch's is there, and never where the host writes bytecode itself.
    monkeypatch.undo()
    folder = tmp_path / "pyc"
    monkeypatch.setattr(background, "BYTECODE_DIR", str(folder))
    monkeypatch.setattr(background, "_installed_bytecode", lambda: False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    assert background.bytecode_unwritten()
    cached = boot.cached_in(str(folder), torch.__file__)
    os.makedirs(os.path.dirname(cached))
    open(cached, "wb").close()
    assert not background.bytecode_unwritten()
    os.remove(cached)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert not background.bytecode_unwritten()


def test_a_child_whose_bytecode_folder_lacks_torchs_compiles_the_runs_sources_into_it_first(tmp_path, monkeypatch):
    """The H200's fresh machine: no bytecode anywhere, so the first child compiled torch's sources one by one as
    it imported them (14-25 s). It now starts as compile_callback.boot, which compiles them in parallel first."""
    import json as json_module

    from compile_callback import boot

    folder = str(tmp_path / "pyc")
    monkeypatch.setattr(background, "BYTECODE_DIR", folder)
    monkeypatch.setattr(background, "_installed_bytecode", lambda: False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    listed = [json_module.__file__, boot.__file__, str(tmp_path / "broken.py")]
    (tmp_path / "broken.py").write_text("def (:\n")  # a source that does not compile is left to its import
    monkeypatch.setattr(boot, "sources", lambda modules, torch_folder: listed)
    listings = []
    monkeypatch.setattr(boot, "write_listing", lambda paths, write=boot.write_listing:
                        listings.append(write(paths)) or listings[-1])
    monkeypatch.setattr(boot, "WORKERS", 2)  # as on a machine with 4 cores or more
    # Through a link to the package's folder (a venv's lib64, a linked home): a script's sys.path[0] is the
    # folder's real path, where this package's profile.py would shadow the standard library's (cProfile,
    # which Dynamo imports, imports it).
    os.symlink(os.path.dirname(boot.__file__), tmp_path / "linked")
    monkeypatch.setattr(boot, "__file__", str(tmp_path / "linked" / "boot.py"))
    standby = background.Standby(("json",))
    assert standby.process.args[1] == boot.__file__  # started as the boot script (as every child is)
    assert standby.precompiles  # what the launcher reads: no second writer beside it
    child = background.start("model", nn.Linear(4, 4), ((torch.randn(2, 4),), {}), CompileOptions(backend="eager"),
                             standby=standby, context=contextlib.nullcontext, device=torch.device("cpu"), verify=True,
                             tolerance=None)
    while not child.done():
        time.sleep(0.1)
    compiled, said = child.outcome()
    assert compiled, said
    assert "start-up: bytecode of 2 sources compiled first, in 2 processes" in child.stages, child.stages  # forked
    assert all(os.path.exists(boot.cached_in(folder, path)) for path in listed[:2])
    assert not os.path.exists(boot.cached_in(folder, listed[2]))
    assert len(listings) == 1 and not os.path.exists(boot.listing_of(listings[0]))  # the child removed the listing
    assert listings[0].split(" ")[0] == "2"
    # With a core or two (the CPU machine's), compiling first in one process is slower than without: not done.
    monkeypatch.setattr(boot, "WORKERS", 1)
    serial = background.Standby(("json",))
    serial.stop()
    assert len(listings) == 1 and not serial.precompiles  # no listing: nothing compiled first
    # Once torch's bytecode is in the folder, a child starts as before and reads it.
    os.makedirs(os.path.dirname(boot.cached_in(folder, torch.__file__)), exist_ok=True)
    open(boot.cached_in(folder, torch.__file__), "wb").close()
    monkeypatch.setattr(boot, "WORKERS", 2)
    again = background.Standby(("json",))
    again.stop()
    assert len(listings) == 1 and not again.precompiles


def test_a_childs_bytecode_is_compiled_by_half_the_cores_it_may_use_at_most_eight():
    # The H200 machine's 16 cores: 8 processes (a precedence slip once made it 4 there, and its start-up 5.7 s
    # against 2.9-3.4 s); the CPU machine's 2: one, so no pool at all.
    from compile_callback import boot

    assert [boot.workers(cores) for cores in (1, 2, 3, 4, 6, 16, 64)] == [1, 1, 1, 2, 3, 8, 8]


def test_a_fit_that_fails_before_it_starts_stops_the_standby_its_setup_started(tmp_path, monkeypatch):
    standbys = []
    monkeypatch.setattr(background, "Standby", _recorded(background.Standby, standbys))
    monkeypatch.setattr(background, "policy", lambda *args, **kwargs: None)  # on, as on a GPU by default

    class BrokenConfigure(FasterCompiled):
        def configure_optimizers(self):  # after the callbacks' setup, before on_fit_start
            raise RuntimeError("no optimizer today")

    trainer = make_trainer(tmp_path, [CompileCallback(backend="eager")], max_steps=5, limit_val_batches=0)
    with pytest.raises(RuntimeError, match="no optimizer today"):
        trainer.fit(BrokenConfigure(), loader(batch_size=8))
    [standby] = standbys
    assert standby.process.poll() is not None and not os.path.exists(standby.log)


_PARENT_ONLY = "compile_callback_test_parent_only"


@torch._dynamo.register_backend(name=_PARENT_ONLY)
def _parent_only(graph_module, example_inputs):
    """A backend registered in this process only: a child's compile with it fails."""
    return graph_module.forward


@pytest.mark.slow
def test_a_child_that_fails_leaves_the_trial_to_compile_in_process(tmp_path):
    model = FasterCompiled()
    _, decision = _fit(tmp_path, model, backend=_PARENT_ONLY)
    assert decision["background"].startswith("not prepared in the background: the child failed (exit code 1)")
    assert decision["background_s"] is None
    assert _PARENT_ONLY in decision["background"]  # the child's own error, named
    assert decision["kept"] and decision["verified"] is True


def test_where_background_compiles_are_on():
    inductor, cpu, cuda = CompileOptions(backend="inductor"), torch.device("cpu"), torch.device("cuda")
    assert policy(None, device=cuda, world_size=1, options=inductor) is None
    assert "off on CPU" in policy(None, device=cpu, world_size=1, options=inductor)
    assert policy(True, device=cpu, world_size=1, options=inductor) is None  # asked for: CPU too
    assert "(background_compile=False)" in policy(False, device=cuda, world_size=1, options=inductor)
    assert "off by default for 2 processes" in policy(None, device=cuda, world_size=2, options=inductor)
    assert policy(True, device=cuda, world_size=2, options=inductor) is None  # asked for: rank 0's child
    assert "backend given by name" in policy(True, device=cuda, world_size=1, options=CompileOptions(backend=_parent_only))
    assert "'eager'" in policy(None, device=cuda, world_size=1, options=CompileOptions(backend="eager"))
    with pytest.raises(ValueError, match="`background_compile` must be True, False or None"):
        CompileCallback(background_compile="yes")


def test_a_child_that_cannot_exit_does_not_hold_the_fit(tmp_path, monkeypatch):
    """A child killed inside an uninterruptible call (the GPU driver) exits only when the call returns: the
    fit's end waits KILL_WAIT_S for it, then goes on (an unbounded wait would hang the fit with it)."""
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    real_wait = process.wait
    waited = []

    def stuck_wait(timeout=None):  # as a process that SIGKILL cannot end yet
        waited.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded wait for a killed child")
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(process.args, timeout)

    monkeypatch.setattr(background, "KILL_WAIT_S", 0.2)
    monkeypatch.setattr(process, "wait", stuck_wait)
    payload, log = tmp_path / "payload.pkl", tmp_path / "child.log"
    payload.write_bytes(b""), log.write_text("")
    child = background.BackgroundCompile(process, str(payload), str(log), time.monotonic())
    started = time.monotonic()
    child.discard()
    assert waited == [0.2] and time.monotonic() - started < 5
    assert not payload.exists() and not log.exists()  # its files are gone all the same
    assert real_wait(timeout=30) is not None  # the kill was sent: the process ends


class MakesATensorInForward(FasterCompiled):
    """Creates a tensor in its forward, in the default dtype: bf16 under Lightning's ``"bf16-true"``, whose
    forward context sets it (a child that did not would add a float32 tensor and feed bf16 weights float32)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x + torch.zeros(x.shape[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
def test_the_childs_verification_stands_where_the_trial_compiled_from_its_cache(tmp_path, precision):
    # Inductor, its caches in the fit's folder: the child compiles and verifies the whole model there, the
    # trial's compile comes whole from that cache, and the child's check stands for the trial's (on the
    # H200 the trial's own took 22 s of stopped training for GPT-2: its fp32 reference 17 s). Under
    # "bf16-true" the child compiles in the default dtype the training forward has.
    torch._dynamo.reset()
    callback = CompileCallback(backend="inductor", background_compile=True, cache_dir=str(tmp_path / "cache"),
                               eager_baseline_steps=2, warmup_steps=1, trial_steps=4, max_trials=1)
    model = MakesATensorInForward()
    # Room for a slow child (an Inductor compile in a fresh interpreter on a loaded 2-core machine): eager
    # steps sleep 100 ms while it works, the plan's steps after it take milliseconds.
    steps = 3 * STEPS
    trainer = make_trainer(tmp_path, [callback], max_steps=steps, max_epochs=100, limit_val_batches=0,
                           precision=precision)
    trainer.fit(model, loader(batch_size=8))
    assert trainer.global_step == steps and model.batches_seen == steps
    assert callback.last_report["decisions"], callback.last_report["plan"]["notes"]
    (decision,) = callback.last_report["decisions"]
    assert decision["background"].startswith("prepared in the background: the child compiled and checked it in")
    assert decision["compile_cache"] == "warm" and decision["kept"] and decision["verified"] is True
    assert decision["error_in"].endswith("; verified in the background child"), decision
    here = {k for k in decision["setup_s"] if not k.startswith("in the child: ")}
    assert here == {"compiled (from the child's cache)", "verification in all"}, decision["setup_s"]
    assert {"in the child: eager", "in the child: compiled"} <= set(decision["setup_s"])  # where the child's time went


def test_a_standby_runs_below_the_runs_priority_from_its_start_not_only_once_its_payload_comes():
    # Its imports (seconds of a core's work beside the first training steps) are the child's work too.
    want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + background.CHILD_NICENESS)
    standby = background.Standby(("json",))
    try:
        deadline = time.monotonic() + 30
        while os.getpriority(os.PRIO_PROCESS, standby.process.pid) != want and time.monotonic() < deadline:
            assert standby.process.poll() is None, open(standby.log).read()
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, standby.process.pid) == want
    finally:
        standby.stop()
    assert os.getpriority(os.PRIO_PROCESS, 0) == want - background.CHILD_NICENESS or want == 19  # the run's own unchanged


def test_the_childs_niceness_can_be_set_from_the_environment_and_a_malformed_value_is_named(monkeypatch):
    monkeypatch.setenv(background.NICENESS_VARIABLE, "0")
    assert background.child_niceness() == 0
    monkeypatch.setenv(background.NICENESS_VARIABLE, "high")
    with pytest.raises(ValueError, match="COMPILE_CALLBACK_CHILD_NICENESS must be a whole number from 0 .* got 'high'"):
        policy(True, device=torch.device("cpu"), world_size=1, options=CompileOptions())  # at the fit's start
    monkeypatch.delenv(background.NICENESS_VARIABLE)
    assert background.child_niceness() == background.CHILD_NICENESS


def test_the_cpus_a_child_may_use_can_be_set_from_the_environment_and_a_bad_list_is_named(monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    last = allowed[-1]
    monkeypatch.setenv(background.CPUS_VARIABLE, f"{last}-{last}")
    standby = background.Standby(("json",))  # as every child starts: a spawned interpreter
    try:
        assert os.sched_getaffinity(standby.process.pid) == {last}
    finally:
        standby.stop()
    assert os.sched_getaffinity(0) == set(allowed)  # the run's own CPUs are left as they were
    monkeypatch.setenv(background.CPUS_VARIABLE, f"{allowed[0]}, {last}")
    assert background.child_cpus() == {allowed[0], last}
    for bad in ("eight", f"{os.cpu_count()}", f"{last}-"):
        monkeypatch.setenv(background.CPUS_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"COMPILE_CALLBACK_CHILD_CPUS must list CPUs of this machine.*got '{bad}'"):
            policy(True, device=torch.device("cpu"), world_size=1, options=CompileOptions())  # at the fit's start
    monkeypatch.delenv(background.CPUS_VARIABLE)
    assert background.child_cpus() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the run, one for its child")
def test_a_run_pinned_to_some_cpus_can_keep_its_child_on_others():
    # The use the variable is for: training pinned (taskset) to CPUs of its own, the child kept off them.
    first, *_, last = sorted(os.sched_getaffinity(0))
    script = (f"import os; os.sched_setaffinity(0, {{{first}}}); from compile_callback import background; "
              f"s = background.Standby(('json',)); print(sorted(os.sched_getaffinity(0)), "
              f"sorted(os.sched_getaffinity(s.process.pid))); s.stop()")
    env = {**os.environ, background.CPUS_VARIABLE: str(last)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split("\n")[0] == f"[{first}] [{last}]", out.stderr[-2000:]


def test_a_child_leaves_cudnn_benchmark_off_whatever_the_parent_runs_with():
    # The parent benchmarks its convolutions (the harness's Trainer sets it): a child that did too would time
    # every convolution's algorithms on the GPU training shares; no compile cache keys the flag.
    import contextlib

    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = True
        settings = background._settings(contextlib.nullcontext, torch.device("cpu"))
        torch.backends.cudnn.benchmark = False  # as a fresh child starts
        background._apply(settings)
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before


def test_the_childs_settings_leave_fp32_precision_as_the_parent_has_it():
    # torch 2.14: setting a legacy TF32 flag, even to its default, turns fp32_precision "none" into "ieee",
    # which is in Inductor's cache key: a child that set them compiled a graph the trial then missed.
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision")
    import contextlib

    before = matmul.fp32_precision
    settings = background._settings(contextlib.nullcontext, torch.device("cpu"))
    try:
        background._apply(settings)
        assert matmul.fp32_precision == before
        settings["flags"]["fp32_precision"]["cuda.matmul"] = "ieee"  # a parent that asked for it: carried
        background._apply(settings)
        assert matmul.fp32_precision == "ieee"
    finally:
        matmul.fp32_precision = before


def test_the_payload_writes_plain_tensors_as_bytes_and_keeps_layout_ties_and_views():
    # Each plain tensor that fills its storage goes as its bytes (torch's own pickling saves each storage
    # with torch.save into a buffer first); the child must get what the run has, or its compile keys
    # Inductor's cache differently: dtype, shape, strides (channels_last), parameters as parameters,
    # requires_grad, attributes, tied weights tied; a view and its base get a storage each, as torch's
    # own pickling gives them.
    net = TiedNet()
    net.conv.weight.requires_grad_(False)
    images = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    held = ((images,), {"ids": torch.arange(6)})
    file, as_bytes = io.BytesIO(), []

    class Counted(background._PayloadPickler):
        def reducer_override(self, obj):
            reduced = super().reducer_override(obj)
            if reduced is not NotImplemented:
                as_bytes.append(reduced)
            return reduced

    Counted(file).dump((net, held))
    copy, ((images_copy,), kwargs) = pickle.loads(file.getvalue())
    assert_same_state(net, copy)
    assert copy.conv.weight.is_contiguous(memory_format=torch.channels_last) and copy.conv.weight.note == "kept"
    assert copy.head.weight is copy.embed.weight
    plain = pickle.loads(pickle.dumps(net))
    copy.table[1, 0] = plain.table[1, 0] = -1.0
    assert copy.row[0] == plain.row[0] == 4.0
    assert images_copy.stride() == images.stride() and torch.equal(images_copy, images)
    assert torch.equal(kwargs["ids"], torch.arange(6))
    # The conv's weight and bias, the tied weight once, the table, the images and the ids went as bytes;
    # the view (a part of its storage) went torch's way.
    assert len(as_bytes) == 6 and all(function is background._rebuild_tensor for function, _ in as_bytes)


def assert_same_state(original: nn.Module, copy: nn.Module) -> None:
    """Every parameter and buffer of ``copy`` as ``original``'s: type, dtype, shape, strides, values, requires_grad."""
    for (name, before), (_, loaded) in zip(original.state_dict(keep_vars=True).items(), copy.state_dict(keep_vars=True).items()):
        assert type(loaded) is type(before) and loaded.dtype == before.dtype and loaded.device == before.device, name
        assert loaded.shape == before.shape and loaded.stride() == before.stride(), name
        assert torch.equal(loaded, before) and loaded.requires_grad == before.requires_grad, name


class TiedNet(nn.Module):
    """Channels_last, bf16, a tied weight, a buffer that views another, an attribute on a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.embed = nn.Embedding(10, 4).to(torch.bfloat16)
        self.head = nn.Linear(4, 10, bias=False).to(torch.bfloat16)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("table", torch.arange(12.0).reshape(3, 4))
        self.register_buffer("row", self.table[1])  # a view of another buffer
        self.conv.weight.note = "kept"


def test_named_regions_say_they_have_no_trial_for_a_child(tmp_path):
    callback = CompileCallback(["blocks.*"], backend="eager", background_compile=True, eager_baseline_steps=2)
    trainer = make_trainer(tmp_path, [callback], max_steps=6, max_epochs=1, limit_val_batches=0)
    trainer.fit(TinyModel(), loader(batch_size=8))
    assert any(n.startswith("background compile off: named regions") for n in callback.last_report["plan"]["notes"])


def test_only_one_process_waits_for_a_child_quietly():
    """Under DDP the ranks agree every POLL_EVERY of the planner's batches whether every child is done: a rank
    that skipped the planner in some batches (the quiet waiting path) would meet the others at another batch.
    So a planner waits alone, and its batches may be quiet, in one process only."""
    from tests.test_mode_trial import Blocks, unrun_planner

    planner = unrun_planner(Blocks(), device="cpu")
    assert not planner.waiting_alone()  # no child compiles
    planner.compiling_in_background = ("model", 16, None)
    assert planner.waiting_alone()
    planner.processes = 2
    assert not planner.waiting_alone()
