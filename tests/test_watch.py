import logging

import pytest
import torch
import torch._dynamo.utils as dynamo_utils

from compile_callback.regions import CompileOptions, compile_region, resolve_regions
from compile_callback.watch import (
    AT_CALL,
    COMPREHENSION,
    DATA_DEPENDENT_BRANCH,
    NO_RESUME_POINT,
    UNCLASSIFIED,
    CompileWatch,
    RegionCompileStats,
    graph_break_kind,
    readable_guard_failure,
)
from compile_callback import torch_internals
from tests.conftest import Block, BreakingBlock, TinyModel

log = logging.getLogger(__name__)


class LoggingBlock(Block):
    """A logger call, which dynamo does not trace: it breaks the graph at the call and resumes after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        log.debug("a call dynamo runs eagerly between two graphs")
        return torch.relu(y) + x


WATCHES = []


@pytest.fixture(autouse=True)
def stop_watches():
    yield
    while WATCHES:
        WATCHES.pop().stop()


def _watch(model, regions):
    names = {id(m): n for n, m in model.named_modules()}
    watch = CompileWatch({id(m): r.name for r in regions for m in r.modules}, names)
    watch.start()
    WATCHES.append(watch)
    return watch


def test_counts_equal_dynamos_own_and_are_attributed():
    model = TinyModel(block=BreakingBlock)
    regions = resolve_regions(model, ["blocks.*", "head"])
    for region in regions:
        compile_region(region, CompileOptions(backend="eager"))
    # torch._dynamo.reset() does not zero dynamo's counters: compare what happened in this test.
    graphs_before, breaks_before = torch_internals.unique_graphs(), torch_internals.graph_break_count()
    watch = _watch(model, regions)
    for n in (4, 4, 6):
        model(torch.randn(n, 8)).sum().backward()
    watch.collect()
    totals = watch.totals()
    assert totals["graphs"] == torch_internals.unique_graphs() - graphs_before > 0
    assert totals["graph_breaks"] == torch_internals.graph_break_count() - breaks_before > 0
    assert set(watch.stats) == {"blocks.*", "head"}
    assert watch.stats["blocks.*"].graph_breaks == totals["graph_breaks"]
    reasons = list(watch.stats["blocks.*"].graph_break_reasons)
    assert any("conftest.py" in reason and "forward" in reason for reason in reasons)
    watch.stop()


def test_shape_change_recompile_has_readable_guard():
    model = TinyModel()
    regions = resolve_regions(model, ["head"])
    compile_region(regions[0], CompileOptions(backend="eager", dynamic=False))
    watch = _watch(model, regions)
    model(torch.randn(4, 8))
    model(torch.randn(6, 8))
    watch.collect()
    assert watch.stats["head"].recompiles == 1
    assert watch.recompiles[0].reason == "`x.size(0)` changed 4 → 6"


def test_user_compiled_code_is_named_by_its_module():
    model = TinyModel()
    model.embed.compile(backend="eager")
    watch = _watch(model, [])
    model(torch.randn(3, 8))
    watch.collect()
    assert list(watch.stats) == ["embed"]
    assert watch.stats["embed"].graphs == 1


def test_user_compiled_child_called_model_is_not_the_whole_model():
    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = TinyModel()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

    wrapper = Wrapper()
    wrapper.model.compile(backend="eager")
    watch = _watch(wrapper, [])
    wrapper(torch.randn(3, 8))
    watch.collect()
    assert list(watch.stats) == ["self.model"]


def test_recompile_limit_hit_is_detected_as_eager_fallback():
    model = TinyModel()
    regions = resolve_regions(model, ["head"])
    compile_region(regions[0], CompileOptions(backend="eager", dynamic=False))
    watch = _watch(model, regions)
    limit = torch_internals.recompile_limit()
    for n in range(1, limit + 3):
        model(torch.randn(n, 8))
    watch.collect()
    stats = watch.stats["head"]
    assert stats.eager_fallback
    assert f"recompile_limit ({limit})" in stats.fallback_reason
    assert watch.totals()["eager_fallbacks"] == 1


def test_watch_survives_dynamo_reset():
    model = TinyModel()
    regions = resolve_regions(model, ["head"])
    watch = _watch(model, regions)
    torch._dynamo.reset()  # clears dynamo's hooks
    watch.start()
    compile_region(regions[0], CompileOptions(backend="eager"))
    model(torch.randn(2, 8))
    watch.collect()
    assert watch.stats["head"].graphs == 1


def test_readable_guard_failure_leaves_other_text():
    assert readable_guard_failure("0/1: tensor 'x' size mismatch at index 1. expected 512, actual 640") == "`x.size(1)` changed 512 → 640"
    assert readable_guard_failure("3/2: self.n == 4") == "`self.n` (a Python value) changed from 4"
    assert readable_guard_failure("0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0") == (
        "tensor 'x' requires_grad mismatch. expected requires_grad=0"
    )


def test_graph_break_kinds_say_which_breaks_dynamos_counter_counts():
    """counters["graph_break"] holds the break at the logger call, not the data-dependent branch
    (dynamo counts that in counters["unimplemented"]); graph_breaks holds both, and the kinds say which."""
    model = TinyModel(block=BreakingBlock)
    model.blocks[1] = LoggingBlock(16)
    regions = resolve_regions(model, ["blocks.0", "blocks.1"])
    for region in regions:
        compile_region(region, CompileOptions(backend="eager"))
    breaks_before = torch_internals.graph_break_count()
    counted_before = sum(dynamo_utils.counters["graph_break"].values())
    watch = _watch(model, regions)
    model(torch.randn(4, 8)).sum().backward()
    watch.collect()
    counted = sum(dynamo_utils.counters["graph_break"].values()) - counted_before
    totals = watch.totals()
    assert totals["graph_breaks"] == torch_internals.graph_break_count() - breaks_before == 2
    assert totals["graph_breaks_in_dynamo_counter"] == counted == 1
    assert dict(watch.stats["blocks.0"].graph_break_kinds) == {DATA_DEPENDENT_BRANCH: 1}
    assert dict(watch.stats["blocks.1"].graph_break_kinds) == {AT_CALL: 1}
    (branch,) = watch.stats["blocks.0"].graph_break_reasons
    assert branch.startswith("generic_jump") and "not counters['graph_break']" in branch and "conftest.py" in branch
    (call,) = watch.stats["blocks.1"].graph_break_reasons
    assert call.startswith("logging.Logger") and "counters" not in call and "test_watch.py" in call


@pytest.mark.parametrize("reason, kind", [
    ("generic_jump TensorVariable()", DATA_DEPENDENT_BRANCH),
    ("step_unsupported", NO_RESUME_POINT),
    ("comprehension_graph_break", COMPREHENSION),
    ("logging.Logger method not supported for non-export cases", AT_CALL),
    ("Unsupported context manager", AT_CALL),
])
def test_graph_break_kind_from_dynamos_reason(reason, kind):
    assert graph_break_kind(reason) == kind


def test_graph_break_kinds_survive_a_checkpoint_and_old_ones_load():
    stats = RegionCompileStats(graph_breaks=3)
    stats.graph_break_kinds.update({AT_CALL: 2, NO_RESUME_POINT: 1})
    assert RegionCompileStats.from_dict(stats.as_dict()).graph_break_kinds == stats.graph_break_kinds
    old = {key: value for key, value in stats.as_dict().items() if key != "graph_break_kinds"}
    loaded = RegionCompileStats.from_dict(old)  # written before kinds were kept
    assert loaded.graph_breaks == 3 and dict(loaded.graph_break_kinds) == {UNCLASSIFIED: 3}


def test_a_recompile_for_another_backend_is_the_callbacks_retry_not_the_models_churn():
    """A region compiled again with another backend or mode (the planner's next trial of the same code) fails
    dynamo's BACKEND_MATCH guard: dynamo's recompile, counted apart as a retry, never in ``recompiles``."""
    model = TinyModel()
    regions = resolve_regions(model, ["head"])
    watch = _watch(model, regions)
    x = torch.randn(4, 8)
    compile_region(regions[0], CompileOptions(backend="eager"))
    model(x)
    compile_region(regions[0], CompileOptions(backend="aot_eager"))
    model(x)
    watch.collect()
    stats = watch.stats["head"]
    assert stats.retry_recompiles == 1 and stats.recompiles == 0 and not watch.recompiles, stats
    assert sum(len(r) for r in dynamo_utils.guard_failures.values()) >= 1  # dynamo saw a recompile
