"""When the compile/* scalars are logged: every `log_every_n_steps` batches, at each epoch's end and at
the end of fit, read back from TensorBoard's own event files, step by step."""

import pytest
from lightning.pytorch.loggers import TensorBoardLogger

from compile_callback import CompileCallback
from tests.conftest import BreakingBlock, TinyModel, loader, make_trainer, read_scalars

BATCHES_PER_EPOCH = 12  # 96 samples, batches of 8
EPOCHS = 2
# Logged only at an epoch's end (and so not at the end of fit): per-epoch counts and per-region figures.
EPOCH_END_ONLY = ("compile/recompiles_epoch", "compile/region/")
# Logged from the first point on: counts that exist before anything is compiled.
FROM_THE_START = (
    "compile/graphs", "compile/graph_breaks", "compile/recompiles", "compile/compile_time_s",
    "compile/eager_fallbacks", "compile/regions_compiled", "compile/regions_reverted", "compile/eager_step_time_ms",
)
# Has a value only while the compiled steps measure faster than eager (here about as fast): it comes and
# goes with the timings, at the logging points only.
COMES_AND_GOES = ("compile/anatomy/break_even_steps",)


def scheduled_steps(every: int) -> list[int]:
    """The global steps of the callback's logging points, once per logging call: every ``every`` batches
    (after the batch, so at global step ``n * every``), each epoch's end, and the end of fit."""
    total = BATCHES_PER_EPOCH * EPOCHS
    periodic = list(range(every, total + 1, every))
    epoch_ends = [BATCHES_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)]
    return sorted(periodic + epoch_ends + [total])


@pytest.mark.parametrize(("trainer_every", "callback_every", "every"), [
    (5, None, 5),  # the callback follows the Trainer's log_every_n_steps
    (50, 4, 4),  # its own log_every_n_steps wins over the Trainer's
])
def test_every_compile_scalar_is_logged_at_exactly_its_steps(tmp_path, trainer_every, callback_every, every):
    callback = CompileCallback(["blocks.*"], backend="eager", eager_baseline_steps=2, warmup_steps=1,
                               log_every_n_steps=callback_every)
    trainer = make_trainer(tmp_path, [callback], logger=TensorBoardLogger(str(tmp_path), name="tb"),
                           max_epochs=EPOCHS, log_every_n_steps=trainer_every)
    trainer.fit(TinyModel(block=BreakingBlock), loader(batch_size=8))
    assert trainer.global_step == BATCHES_PER_EPOCH * EPOCHS
    scalars = {tag: [step for step, _ in events] for tag, events in read_scalars(trainer.logger.log_dir).items()
               if tag.startswith("compile/")}
    schedule = scheduled_steps(every)
    epoch_ends = [BATCHES_PER_EPOCH * (epoch + 1) for epoch in range(EPOCHS)]
    for tag in FROM_THE_START:
        assert scalars.get(tag) == schedule, (tag, scalars.get(tag), schedule)
    assert any(tag.startswith("compile/region/") for tag in scalars)
    for tag, steps in scalars.items():
        if tag.startswith(EPOCH_END_ONLY):
            assert steps == epoch_ends, (tag, steps)
        elif tag in COMES_AND_GOES:
            assert all(steps.count(s) <= schedule.count(s) for s in steps), (tag, steps, schedule)
        else:
            # A figure that needs compiled steps timed first (speedup, step time) starts later, then
            # follows the schedule from that point on.
            assert steps and steps == [s for s in schedule if s >= steps[0]], (tag, steps, schedule)
            assert steps[0] <= BATCHES_PER_EPOCH, (tag, steps)  # logged within the first epoch already
    assert scalars["compile/speedup"][0] < BATCHES_PER_EPOCH  # compiled at batch 3: timed within the epoch


def test_with_gradient_accumulation_the_cadence_counts_optimizer_steps(tmp_path):
    """Lightning's log_every_n_steps counts optimizer steps (train/loss below is logged every 2 of them);
    the compile/* scalars should follow the same steps, not every 2 batches (= every optimizer step)."""
    callback = CompileCallback(["blocks.*"], backend="eager", eager_baseline_steps=2, warmup_steps=1)
    trainer = make_trainer(tmp_path, [callback], logger=TensorBoardLogger(str(tmp_path), name="tb"),
                           max_epochs=1, log_every_n_steps=2, accumulate_grad_batches=2)
    trainer.fit(TinyModel(), loader(batch_size=8))
    assert trainer.global_step == BATCHES_PER_EPOCH // 2
    scalars = read_scalars(trainer.logger.log_dir)
    assert len(scalars["train/loss"]) == 3  # Lightning's own: every 2 of the 6 optimizer steps
    # every 2 optimizer steps (2, 4, 6), the epoch's end (6) and the end of fit (6)
    assert [step for step, _ in scalars["compile/graphs"]] == [2, 4, 6, 6, 6]
