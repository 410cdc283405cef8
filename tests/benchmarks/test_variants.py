"""The harness's compiled variants hand torch.compile arguments it accepts."""

import pytest
import torch

from benchmarks.variants import VARIANTS, compile_kwargs


@pytest.mark.parametrize("name", [n for n, v in VARIANTS.items() if v.compile is not None])
def test_every_compiled_variant_passes_arguments_torch_compile_accepts(name):
    kwargs = compile_kwargs(VARIANTS[name], smoke=False)
    torch.compile(torch.nn.Linear(2, 2), **kwargs)  # mode with options, or an unknown option, raise here


def test_the_fallback_random_variant_is_the_cuda_graph_plan_with_eager_random_numbers():
    kwargs = compile_kwargs(VARIANTS["whole_ro_fr"], smoke=False)
    assert kwargs == {"backend": "inductor", "options": {"triton.cudagraphs": True, "fallback_random": True}}


def test_the_next_standby_experiment_readies_an_interpreter_at_every_hand_over_while_it_runs_only():
    from benchmarks.runner import readied_standbys
    from compile_callback import background

    own = background.bytecode_unwritten
    with readied_standbys(VARIANTS["callback"]):
        assert background.bytecode_unwritten is own
    with readied_standbys(VARIANTS["callback_next_standby"]):
        assert background.bytecode_unwritten() is True  # the Launcher's condition for a next standby holds
    assert background.bytecode_unwritten is own
    assert VARIANTS["callback_next_standby"].callback == VARIANTS["callback"].callback  # the defaults otherwise
