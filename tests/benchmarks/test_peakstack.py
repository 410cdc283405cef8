"""The peak finder of ``benchmarks.diagnostics.peakstack`` on a hand-written allocator trace."""

from benchmarks.diagnostics.peakstack import peak_of


def _alloc(addr: int, size: int, where: str) -> dict:
    return {"action": "alloc", "addr": addr, "size": size,
            "frames": [{"filename": f"/x/site-packages/compile_callback/{where}.py", "line": 1, "name": where}]}


def _free(addr: int) -> dict:
    return {"action": "free_completed", "addr": addr, "size": 0, "frames": []}


def test_the_peak_names_the_blocks_alive_then_not_later_ones():
    trace = [
        _alloc(1, 100, "params"), _alloc(2, 50, "reference"), _alloc(3, 70, "activations"),
        {"action": "free_requested", "addr": 3, "size": 70, "frames": []},  # not freed until completed
        _free(3), _free(2),
        _alloc(4, 90, "later"),  # 190 < the peak of 220
        _alloc(2, 10, "reused_address"),
    ]
    found = peak_of(trace, before=5)
    assert found["peak_bytes"] == 5 + 100 + 50 + 70
    assert found["peak_entry"] == 2
    assert found["made_by"] == ["compile_callback/activations.py:1 activations"]
    assert [(g["bytes"], g["stack"][0]) for g in found["groups"]] == [
        (100, "compile_callback/params.py:1 params"), (70, "compile_callback/activations.py:1 activations"),
        (50, "compile_callback/reference.py:1 reference"), (5, "before recording")]
