"""Profiling eager steps: forward time per candidate module, launch-boundness, and held inputs.

Mechanism only. Forward pre/post hooks bracket each candidate module's forward with CUDA events (or
``perf_counter`` on CPU); the events are read once profiling ends, so the profiled steps never wait on
the host. Backward time is estimated as twice the forward time (the usual ratio for matmul- and
conv-dominated layers); the estimate only orders candidates, the keep/revert decision is measured.
The first call of each candidate module also holds a detached copy of its inputs in host memory (or
only of those asked for, the others when their trial comes: :meth:`RegionProfiler.hold_next`), which
verification replays later on the device: held on the GPU, the inputs of every repeated block of a
transformer stayed allocated beside every later step (HF GPT-2 124M: 0.57 GB above its eager peak, timm
ViT-B: 0.5 GB, measured on the H200). Those copies (pinned host memory, allocated on the host) fall in
the first profiled step, inside the spans of the modules around them, so that step is not timed when
there are others: in the GPT-2 recipe on the H200 they put 14 copies of 25 MB inside the root's first
forward, and the blocks' share read too low for the payback order to see that they repay.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from compile_callback import torch_internals
from compile_callback.timing import elapsed_ms, time_mark


def _copy(value: Any, device: torch.device | str) -> Any:
    """A detached copy of ``value`` (tensors inside lists, tuples and dicts too) on ``device``, strides kept.

    Strides are kept because dynamo guards on them: a contiguous copy of a sliced batch would make
    verification compile a graph that training never uses. A copy to host memory goes to pinned memory
    without a sync when it comes from a GPU; its copy back is queued on the same stream, so it is ready
    whenever the GPU reaches it.
    """
    if isinstance(value, torch.Tensor):
        device = torch.device(device)
        pin = device.type == "cpu" and value.is_cuda
        copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=device, pin_memory=pin)
        copy.copy_(value.detach(), non_blocking=pin or copy.is_cuda)
        if value.requires_grad and copy.is_floating_point():
            copy.requires_grad_(True)
        return copy
    if isinstance(value, (list, tuple)):
        items = [_copy(v, device) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        return {k: _copy(v, device) for k, v in value.items()}
    return value


class RegionProfiler:
    """Times the forward of named modules during eager steps and holds one input of each.

    Args:
        modules: ``name -> module`` to profile.
        device: where the model runs.

    Example:
        >>> profiler = RegionProfiler({"blocks.0": block}, torch.device("cpu"))
        >>> profiler.attach(); ...run steps...; profiler.detach()
        >>> profiler.forward_ms()["blocks.0"]
    """

    def __init__(self, modules: dict[str, nn.Module], device: torch.device, *, hold: set[str] | None = None) -> None:
        """``hold``: the modules whose first input the profiled steps hold (None: every one); the others'
        are held when asked for (:meth:`hold_next`)."""
        self.modules = modules
        self.hold = hold
        self.seen: set[str] = set()  # modules whose forward ran in a profiled step
        self.use_events = device.type == "cuda" and torch.cuda.is_available()
        self._handles: list[RemovableHandle] = []
        self._open: dict[str, list[Any]] = defaultdict(list)
        self._spans: dict[str, list[tuple[Any, Any, int]]] = defaultdict(list)  # (start, end, step)
        self.device = device
        self.held_inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}  # in host memory
        self.holding_s = 0.0  # host seconds copying held inputs, not yet taken (pinned allocations: ResNet-50's 0.8 s on the H200)
        self.steps = 0

    def _now(self) -> Any:
        return time_mark(self.use_events)

    def attach(self) -> None:
        for name, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(name)))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _pre(self, name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not torch_internals.forward_is_real(module):
                return  # Lightning's DDP reroutes training_step through forward: not a forward call
            self.seen.add(name)
            if name not in self.held_inputs and (self.hold is None or name in self.hold):
                self._hold(name, args, kwargs)
            self._open[name].append(self._now())

        return hook

    def _hold(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.held_inputs[name] = (_copy(args, "cpu"), _copy(kwargs, "cpu"))
        self.holding_s += time.perf_counter() - started

    def hold_next(self, names: list[str]) -> Callable[[], None]:
        """Holds the input of the next training forward (grad enabled: not a validation loop's) of each of
        ``names`` not held yet (a candidate about to be tried); returns what removes the hooks."""
        handles: list[RemovableHandle] = []
        for name in names:
            if name in self.held_inputs:
                continue

            def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str = name) -> None:
                if name not in self.held_inputs and torch.is_grad_enabled() and torch_internals.forward_is_real(module):
                    self._hold(name, args, kwargs)

            handles.append(self.modules[name].register_forward_pre_hook(hook, with_kwargs=True))

        def remove() -> None:
            for handle in handles:
                handle.remove()

        return remove

    def _post(self, name: str):
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self._open[name] and torch_internals.forward_is_real(module):
                self._spans[name].append((self._open[name].pop(), self._now(), self.steps))

        return hook

    def take_holding_s(self) -> float:
        """Host seconds spent copying held inputs since the last call (training waited for them)."""
        holding, self.holding_s = self.holding_s, 0.0
        return holding

    def held_input(self, name: str) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        """The input held for ``name``, copied back to the device for a replay (None if none was held)."""
        held = self.held_inputs.get(name)
        if held is None:
            return None
        args, kwargs = held
        return _copy(args, self.device), _copy(kwargs, self.device)

    def forward_ms(self) -> dict[str, float]:
        """Mean forward milliseconds per profiled step for each module (waits for pending events); the
        first step, which holds the inputs, only when it is the one profiled."""
        if self.use_events and any(self._spans.values()):
            torch.cuda.synchronize()
        first = 1 if self.steps > 1 else 0  # steps are counted from 1; 0: no step count was kept
        steps = max(self.steps - first, 1)
        totals = {}
        for name in self.modules:
            total = 0.0
            for start, end, step in self._spans.get(name, []):
                if step > first:
                    total += elapsed_ms(start, end)
            totals[name] = total / steps
        return totals


def repeated_block_groups(root: nn.Module) -> dict[str, list[str]]:
    """Groups of repeated sibling blocks: children of a ModuleList/Sequential of one class (>= 2).

    Returns ``pattern -> module names``, e.g. ``{"transformer.h.*": ["transformer.h.0", ...]}``.
    """
    groups: dict[str, list[str]] = {}
    for name, module in root.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        if len(children) < 2:
            continue
        classes = {type(child) for _, child in children}
        if len(classes) == 1 and not issubclass(next(iter(classes)), (nn.ModuleList, nn.Sequential)):
            prefix = f"{name}." if name else ""
            if all(child_name.isdigit() for child_name, _ in children):
                groups[f"{prefix}*"] = [f"{prefix}{child_name}" for child_name, _ in children]
    # Keep outermost groups only: a group inside another group's blocks is covered by it.
    names = sorted(groups, key=len)
    kept: dict[str, list[str]] = {}
    for pattern in names:
        members = groups[pattern]
        if not any(member.startswith(other + ".") for other_members in kept.values() for other in other_members for member in members):
            kept[pattern] = members
    return kept

