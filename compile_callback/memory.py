"""Device memory: how much a new reservation can still take, and whether a CUDA-graph pool fits in it.

Mechanism only, read from ``torch.cuda``'s host-side counters (no device sync).
"""

from __future__ import annotations

import torch

GB = 2.0**30


def allocated_bytes(device: torch.device) -> int:
    """The caching allocator's allocated bytes on ``device``, as ``torch.cuda.memory_allocated`` reads them,
    for a per-step read: that function flattens and sorts the allocator's ~150 counters into a new dict on
    every call; the nested dict it flattens is read here as it comes."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    return int(stats.get("allocated_bytes", {}).get("all", {}).get("current", 0))


def peak_bytes(device: torch.device) -> int | None:
    """The allocator's peak allocated bytes on ``device`` (``torch.cuda.max_memory_allocated``), None off CUDA."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated(device)


def graph_pool_free_bytes(device: torch.device) -> int:
    """Bytes reserved in private memory pools on ``device`` (CUDA graphs' pools) and not allocated now.

    A replayed CUDA graph allocates nothing: its intermediates reuse its pool's blocks, which the
    allocated counters show only while a tensor lives in them. At the forward/backward boundary the
    forward's saved activations are allocated (counted) and the pool's free blocks are what the backward
    graph uses; the two together bound the step's peak. One ``torch.cuda.memory_snapshot`` (a walk over
    every segment): for the sampled memory reads only, never every step."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    free = 0
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", index) == index and tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            free += int(segment["total_size"]) - int(segment["allocated_size"])
    return free


def plan_peak_bytes(allocated_high: int | None, *, cuda_graphs: bool, graph_step_high: int | None) -> int | None:
    """The kept plan's step peak: the most allocated at its forward/backward boundary, or under CUDA graphs
    the most of allocated and its pools' free bytes read at one boundary (:func:`graph_pool_free_bytes`:
    a replay's intermediates reuse free pool blocks); None where unread."""
    high = graph_step_high if cuda_graphs else allocated_high
    return high or None


def room_bytes(device: torch.device) -> int | None:
    """Bytes a new reservation could still take on ``device``, or None off CUDA.

    The device's free memory plus the allocator's cached but unused blocks (``empty_cache`` hands them
    back), and no more than the process's share under ``torch.cuda.set_per_process_memory_fraction``
    (a smaller or fuller card: allocations past it raise ``torch.OutOfMemoryError``).
    """
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    room = free + torch.cuda.memory_reserved(device) - allocated
    fraction = torch.cuda.get_per_process_memory_fraction(device)
    if fraction < 1.0:
        room = min(room, int(fraction * total) - allocated)
    return max(room, 0)


def graph_pool_misfit(activations: int | None, room: int | None) -> str | None:
    """Why a CUDA-graph plan would not fit, or None if it may.

    Args:
        activations: bytes the eager step allocated beyond what lives between steps (its activations,
            read at the forward/backward boundary): a CUDA-graph pool holds the compiled step's, which
            are no more than eager's (on the H200 HF GPT-2's plan peaked at 8.2 GB against 13.3 eager).
        room: what a new reservation can take (:func:`room_bytes`), eager's cached blocks handed back.
    """
    if activations is None or room is None or activations <= room:
        return None
    return (f"not tried: its CUDA-graph pool would hold up to {activations / GB:.1f} GB (the eager step's "
            f"activations) and {room / GB:.1f} GB are free")
