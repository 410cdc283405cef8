"""Warm restarts: the auto planner's decisions persisted as JSON, keyed by what they depend on.

A plan is valid for one model structure (module types, parameter names, shapes and dtypes), one torch
version, one device type and one set of callback options. The key is a hash of those; the file also
holds them in clear, so a stale plan is recognised and explained. Only JSON is read: nothing is
unpickled from the plan file.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch
from torch import nn

VERSION = 1


def plan_key(model: nn.Module, *, device: torch.device, options: dict[str, Any]) -> dict[str, Any]:
    """What a plan depends on, as JSON-ready values."""
    structure = [[name, type(module).__qualname__] for name, module in model.named_modules()]
    parameters = [[name, list(p.shape), str(p.dtype)] for name, p in model.named_parameters()]
    digest = hashlib.sha256(json.dumps([structure, parameters], sort_keys=True).encode()).hexdigest()[:16]
    return {"version": VERSION, "model": digest, "torch": torch.__version__, "device": device.type, "options": options}


def plan_path(directory: str, key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return os.path.join(directory, f"compile_plan-{digest}.json")


class PlanCacheError(Exception):
    """A plan file that cannot be used; the message says why."""


def load_plan(path: str, key: dict[str, Any]) -> dict[str, Any] | None:
    """The saved entry for ``key``: ``planner`` (the planner's state) and ``eager_by_shape`` (the eager
    median of each batch shape, ``[[shapes, ms], ...]``, empty in files written before it was kept);
    None if there is none.

    Raises:
        PlanCacheError: the file is not valid JSON, not a plan, or made for another key.
    """
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as error:
        raise PlanCacheError(f"{path} is not readable JSON ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("planner"), dict) or "key" not in data:
        raise PlanCacheError(f"{path} is not a compile plan")
    if json.loads(json.dumps(data["key"], default=str)) != json.loads(json.dumps(key, default=str)):
        raise PlanCacheError(f"{path} was made for another model, torch version or options")
    rows = data.get("eager_by_shape", [])
    if not (isinstance(rows, list) and all(_is_shape_row(row) for row in rows)):
        raise PlanCacheError(f"{path} has eager_by_shape rows that are not [[shape, ...], milliseconds] pairs")
    return {"planner": data["planner"], "eager_by_shape": rows}


def _is_shape_row(row: Any) -> bool:
    """``[[[4, 128], [4, 128]], 12.5]``: the shapes of a batch's tensors and their eager median in ms."""
    if not (isinstance(row, list) and len(row) == 2 and isinstance(row[1], (int, float))):
        return False
    shapes = row[0]
    return isinstance(shapes, list) and all(
        isinstance(shape, list) and all(isinstance(size, int) for size in shape) for shape in shapes
    )


def save_plan(
    path: str, key: dict[str, Any], planner_state: dict[str, Any], eager_by_shape: list[Any] | None = None
) -> None:
    """Writes the plan for ``key``; ``eager_by_shape``: the eager median of each batch shape, so that a
    warm restart, which measures no eager baseline of its own, still prices its steps shape by shape."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temporary = path + ".tmp"
    entry = {"key": key, "planner": planner_state, "eager_by_shape": eager_by_shape or []}
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(entry, handle, indent=2, default=str)
    os.replace(temporary, path)
