import pytest
import torch

from compile_callback.regions import CompileOptions, compile_region, resolve_regions
from compile_callback.watch import CompileWatch, readable_guard_failure
from compile_callback import torch_internals
from tests.conftest import BreakingBlock, TinyModel


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
