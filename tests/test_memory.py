"""The kept plan's memory figure: what a CUDA-graph plan's step holds is its tensors and its pool."""

from compile_callback.memory import plan_peak_bytes


def test_a_cuda_graph_plans_peak_counts_its_pools_free_bytes_and_is_unknown_until_read():
    assert plan_peak_bytes(4_000, cuda_graphs=False, pool_free=None) == 4_000
    # A replay allocates nothing: the pool's blocks its backward reuses are not in the allocated count.
    assert plan_peak_bytes(1_000, cuda_graphs=True, pool_free=3_500) == 4_500
    assert plan_peak_bytes(1_000, cuda_graphs=True, pool_free=None) is None  # no figure rather than a low one
    assert plan_peak_bytes(None, cuda_graphs=False, pool_free=None) is None
