"""The kept plan's memory figure: what a CUDA-graph plan's step holds is its tensors and its pool."""

from compile_callback.memory import plan_peak_bytes


def test_a_cuda_graph_plans_peak_is_read_with_its_pool_and_is_unknown_until_read():
    assert plan_peak_bytes(4_000, cuda_graphs=False, graph_step_high=None) == 4_000
    # A replay allocates nothing: its tensors and its pool's free blocks, read together, are the step's.
    assert plan_peak_bytes(1_000, cuda_graphs=True, graph_step_high=4_500) == 4_500
    assert plan_peak_bytes(1_000, cuda_graphs=True, graph_step_high=None) is None  # no figure rather than a low one
    assert plan_peak_bytes(None, cuda_graphs=False, graph_step_high=None) is None
