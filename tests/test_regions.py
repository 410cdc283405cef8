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


def _rerouted_call(module, method_name, *args):
    """What Lightning's DDP strategy does to call ``training_step``: patch ``forward``, call the module."""
    original_forward = module.forward

    def wrapped_forward(*inner_args):
        module.forward = original_forward
        return getattr(module, method_name)(*inner_args)

    module.forward = wrapped_forward
    return module(*args)


def test_compiled_root_runs_a_rerouted_call_eagerly_and_its_own_forward_compiled():
    from torch._dynamo.testing import CompileCounter

    model = TinyModel()
    counter = CompileCounter()
    (region,) = resolve_regions(model, ["model"])
    compile_region(region, CompileOptions(backend=counter))
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    for _ in range(3):
        loss = _rerouted_call(model, "training_step", (x, y), 0)
        loss.backward()
    assert model.batches_seen == 3  # training_step ran once per call, never twice
    assert counter.frame_count == 1  # one graph: the forward; training_step (and its self.log) never traced
    assert torch_internals.is_module_compiled(model)
    revert_region(region)
    assert not torch_internals.is_module_compiled(model)


def test_a_patched_forward_of_an_inner_module_stays_compiled():
    """Only the root is run eagerly under a patched forward: hooks some libraries install on inner
    modules' forward keep their compiled code."""
    from torch._dynamo.testing import CompileCounter

    model = TinyModel()
    counter = CompileCounter()
    (region,) = resolve_regions(model, ["head"])
    compile_region(region, CompileOptions(backend=counter))
    head = model.head
    plain_forward = head.forward
    head.forward = lambda x: plain_forward(x) * 1.0  # a library's wrapper around forward
    head(torch.randn(4, 16))
    assert counter.frame_count >= 1


def test_self_prefix_names_a_submodule_and_model_stays_the_root():
    import lightning as L
    from torch import nn

    class Wrapper(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))

    wrapper = Wrapper()
    (root,) = resolve_regions(wrapper, ["model"])
    (child,) = resolve_regions(wrapper, ["self.model"])
    (layers,) = resolve_regions(wrapper, ["self.model.*"])
    assert root.modules == [wrapper] and root.module_names == [""]
    assert child.modules == [wrapper.model] and child.module_names == ["model"]
    assert layers.module_names == ["model.0", "model.1"]
    with pytest.raises(ValueError, match=r"region 'self.nothing' matches no submodule .*'self.model' for a submodule called model"):
        resolve_regions(wrapper, ["self.nothing"])
