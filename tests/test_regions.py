import pytest
import torch

from compile_callback import torch_internals
from compile_callback.regions import CompileOptions, compile_region, resolve_regions, revert_region
from tests.conftest import TinyModel


def test_names_and_globs_resolve_to_modules():
    model = TinyModel(depth=3)
    blocks, head, whole = resolve_regions(model, ["blocks.*", "head"]) + resolve_regions(model, ["model"])
    assert blocks.module_names == ["blocks.0", "blocks.1", "blocks.2"]
    assert blocks.modules == list(model.blocks)
    assert head.modules == [model.head]
    assert whole.modules == [model] and whole.module_names == [""]


def test_glob_star_is_one_name_component():
    regions = resolve_regions(TinyModel(depth=2), ["blocks.*.linear"])
    assert regions[0].module_names == ["blocks.0.linear", "blocks.1.linear"]


def test_unknown_region_lists_close_matches():
    with pytest.raises(ValueError, match=r"region 'blocs\.\*' matches no submodule of TinyModel\. Close matches: 'blocks"):
        resolve_regions(TinyModel(), ["blocs.*"])


def test_overlapping_regions_are_refused():
    with pytest.raises(ValueError, match=r"regions 'blocks\.\*' and 'blocks\.0\.linear' overlap"):
        resolve_regions(TinyModel(), ["blocks.*", "blocks.0.linear"])


def test_compile_keeps_state_dict_keys_and_revert_restores_eager():
    model = TinyModel()
    keys = list(model.state_dict())
    region = resolve_regions(model, ["blocks.*"])[0]
    compile_region(region, CompileOptions(backend="eager"))
    assert all(torch_internals.is_module_compiled(m) for m in model.blocks)
    assert list(model.state_dict()) == keys
    x = torch.randn(4, 8)
    compiled_out = model(x)
    assert torch_internals.unique_graphs() >= 1
    revert_region(region)
    assert not any(torch_internals.is_module_compiled(m) for m in model.blocks)
    graphs = torch_internals.unique_graphs()
    eager_out = model(torch.randn(5, 8))  # a new shape would recompile if anything were still compiled
    assert torch_internals.unique_graphs() == graphs
    assert eager_out.shape == (5, 4) and compiled_out.shape == (4, 4)


def test_options_refuse_mode_for_default():
    assert "mode" not in CompileOptions(mode="default").as_kwargs()
    assert CompileOptions(mode="reduce-overhead").as_kwargs()["mode"] == "reduce-overhead"
