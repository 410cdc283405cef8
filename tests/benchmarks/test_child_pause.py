"""The child-pause A/B (``callback_pause_ab``, issue 22): a real process, stopped and continued in ABBA blocks
of a real Trainer's steps, and the figures the run's table reads from the blocks' walls."""

from __future__ import annotations

import subprocess
import sys
import time

import lightning as L
import pytest
from torch.utils.data import DataLoader

from benchmarks import runner, table
from benchmarks.measure import ChildPauseAB, ChildPauses, abba_ratios, block_walls
from tests.conftest import TinyModel, classification_data


def _state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def _settled_state(pid: int, stopped: bool, within_s: float = 2.0) -> str:
    """The process's state once it is (or is not) stopped, waiting up to ``within_s`` for it: a signal reaches the
    process, and its state in /proc changes, only once the process is scheduled (a loaded CI host: milliseconds)."""
    deadline = time.monotonic() + within_s
    while (_state(pid) == "T") != stopped and time.monotonic() < deadline:
        time.sleep(0.005)
    return _state(pid)


class StateAtEachStep(L.Callback):
    """The sleeping process's state after each step, once it has followed what ChildPauses set (it goes first)."""

    def __init__(self, pid: int, pauses: ChildPauseAB) -> None:
        self.pid, self.pauses, self.states = pid, pauses, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.states.append(_settled_state(self.pid, stopped=bool(self.pauses.switches) and not self.pauses.switches[-1]["running"]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and sends SIGSTOP")
def test_the_child_is_stopped_in_the_abba_blocks_of_a_fit_and_runs_on_after_them():
    """A process the harness counts as a CompileCallback child (``compile_callback/boot.py`` in its command line)
    is stopped for blocks 1-2 and 5-6 of eight 2-step blocks from step 3, running in blocks 0, 3, 4, 7 and after."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "compile_callback/boot.py"])
    try:
        deadline = time.monotonic() + 10  # until its exec: before, /proc shows this process's command line
        while child.pid not in runner.compile_processes_of_others() and time.monotonic() < deadline:
            time.sleep(0.05)
        pauses = ChildPauseAB(lambda: [p for p in runner.compile_processes_of_others() if p == child.pid],
                              blocks=8, first=3, block_steps=2)
        states = StateAtEachStep(child.pid, pauses)
        trainer = L.Trainer(max_steps=24, callbacks=[ChildPauses(pauses), states], logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(TinyModel(), DataLoader(classification_data(), batch_size=4))
        stopped = [step for step, state in enumerate(states.states, 1) if state == "T"]
        # Stopped after step 5 (block 1 starts) until step 9 (block 3), after step 13 until step 17; then never.
        assert stopped == [5, 6, 7, 8, 13, 14, 15, 16]
        assert [{k: v for k, v in s.items() if k != "seconds"} for s in pauses.switches] == [
            {"step": 5, "running": False, "processes": 1}, {"step": 9, "running": True, "processes": 1},
            {"step": 13, "running": False, "processes": 1}, {"step": 17, "running": True, "processes": 1},
            {"step": 19, "running": True, "processes": 0},
        ]
        assert all(0 <= s["seconds"] < 5 for s in pauses.switches)
        assert _settled_state(child.pid, stopped=False) != "T"
        # A fit that fails inside a stopped block leaves nothing stopped.
        pauses = ChildPauseAB(lambda: [child.pid], blocks=4, first=1, block_steps=1)
        pauses.after_step(2)
        assert _settled_state(child.pid, stopped=True) == "T"
        pauses.resume()
        assert _settled_state(child.pid, stopped=False) != "T"
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ValueError, match="whole ABBA cycles: blocks a multiple of 4; got 6"):
        ChildPauseAB(list, blocks=6)


def test_the_ab_reads_running_blocks_against_stopped_ones_and_leaves_out_cycles_with_nothing_stopped():
    """Blocks of 2 steps from step 2: running blocks' steps take 1.1 s, stopped ones' 1.0 s, and each stop's look
    for the processes 0.5 s more, taken out. The first cycle's stop found no process (the child not started yet):
    left out. The eager runs' same blocks read 1.0."""
    first, block_steps, blocks = 2, 2, 8
    step_s = [1.0] * first + [1.1 if block % 4 in (0, 3) else 1.0 for block in range(blocks) for _ in range(block_steps)]
    step_s[first + 5 * block_steps] += 0.5  # the second cycle's stop (block 5's first step)
    ends = [sum(step_s[: i + 1]) for i in range(len(step_s))]
    walls = block_walls(ends, first, blocks, block_steps)
    assert walls == pytest.approx([2.2, 2.0, 2.0, 2.2, 2.2, 2.5, 2.0, 2.2])
    assert abba_ratios(walls) == pytest.approx([1.1, 4.4 / 4.5])
    assert block_walls(ends[:9], first, blocks, block_steps) == pytest.approx([2.2, 2.0, 2.0])  # whole blocks only
    pauses = ChildPauseAB(list, blocks=blocks, first=first, block_steps=block_steps)
    pauses.switches = [{"step": 4, "running": False, "processes": 0, "seconds": 0.0},
                       {"step": 8, "running": True, "processes": 0, "seconds": 0.0},
                       {"step": 12, "running": False, "processes": 2, "seconds": 0.5},
                       {"step": 16, "running": True, "processes": 2, "seconds": 0.0}]
    summary = pauses.summarize(ends)
    assert summary["cycle_ratios"] == pytest.approx([1.1]) and summary["ratio"] == pytest.approx(1.1)
    assert summary["cycles_without_a_process"] == 1
    eager = {"variant": "eager", "step_ends_s": [float(i + 1) for i in range(20)]}
    result = {"settings": {"pairs": 1, "total_steps": 18}, "records": [
        eager, {"variant": "callback_pause_ab", "child_pause_ab": summary, "step_ends_s": ends}, eager]}
    pooled = table.paired_child_pauses(result, "callback_pause_ab")
    assert pooled["per_run"] == pytest.approx([1.1]) and pooled["ratio"] == pytest.approx(1.1)
    assert pooled["eager_ratio"] == pytest.approx(1.0) and pooled["eager_cycles"] == 4
    assert table.paired_child_pauses(result, "callback") is None
