"""Policy against recompile churn: when recompiles are churn, and what to do about each cause.

Churn is a recompile after the first training epoch (shapes should have been seen by then), more
than ``max_recompiles_per_epoch`` recompiles in one epoch, or a region that hit dynamo's recompile
limit and silently runs eager. Each (region, cause) is acted on once. The callback carries out the
actions (it owns the regions and the loaders); this module only decides and words them.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any

from compile_callback.watch import PYTHON_VALUE, SHAPE, Recompile

ON_RECOMPILE_POLICIES = ("warn", "pad", "dynamic", "eager", "raise")


class RecompileChurnError(RuntimeError):
    """Raised by ``on_recompile="raise"``: names the region, the failed guard and the fix."""


@dataclasses.dataclass(frozen=True)
class ChurnAction:
    """One thing to do about one cause of churn in one region."""

    policy: str
    region: str
    cause: str
    kind: str
    why: str  # "recompiled after the first epoch", "5 recompiles in epoch 0 (limit 4)", "hit the recompile limit"

    def message(self) -> str:
        return f"`{self.region}` recompiles: {self.cause} ({self.why}). Fix: {fix_for(self.kind, self.cause)}"


def remedies(action: ChurnAction, *, padding_possible: bool) -> tuple[str, ...]:
    """What to do about ``action``, in the order to try: ``"raise"``, ``"pad"`` (padding turned on for
    the rest of the fit), ``"eager"`` (the region reverted), ``"dynamic"`` (the region compiled once more
    with ``dynamic=True``) or ``"warn"``. ``on_recompile="pad"`` pads a changing size only (a shape
    recompile) and only where the loaders can still be padded (the user asked for no padding, and there
    is a training loader); otherwise, or if padding finds no buckets, the region goes dynamic."""
    if action.policy == "pad":
        return ("pad", "dynamic") if action.kind == SHAPE and padding_possible else ("dynamic",)
    return (action.policy,)


def not_padded(action: ChurnAction, pad: Any, *, padding_failed: bool = False) -> str:
    """Why ``on_recompile="pad"`` fell back to ``"dynamic"`` for ``action`` (``pad``: the fit's padding)."""
    if padding_failed:
        return "the training dataloaders could not take the padding collate"
    if action.kind != SHAPE:
        return "not a dataloader size"
    if pad is not None:
        return f"the loaders are padded already (pad={pad!r})"
    return "no training dataloader"


# Where a Hugging Face model's key/value cache is read: a cache built while training guards each layer apart.
HF_CACHE_SOURCE = "transformers/cache_utils.py"
HF_CACHE_FIX = ("a Hugging Face model builds its key/value cache while training, and the compiled blocks guard "
                "on each layer's entry (a graph per layer): training needs no cache, so set "
                "model.config.use_cache = False (or pass use_cache=False to its forward).")


def fix_for(kind: str, cause: str = "") -> str:
    """What to change for recompiles of ``kind``; ``cause``, the guard failure's text, may name a better fix."""
    if HF_CACHE_SOURCE in cause:
        return HF_CACHE_FIX
    if kind == SHAPE:
        return (
            "pad that dimension to a few fixed sizes (CompileCallback(pad='auto')), or compile the region "
            "with dynamic=True (on_recompile='dynamic') so one graph serves every size."
        )
    if kind == PYTHON_VALUE:
        return (
            "a Python value the compiled code reads changes between calls: keep it constant, pass it as a "
            "tensor, or move it out of the compiled region."
        )
    return "make the input's dtype, device, requires_grad and layout the same on every call."


class ChurnPolicy:
    """Decides, after each batch, which recompile causes are churn and what to do about them.

    Args:
        policy: one of :data:`ON_RECOMPILE_POLICIES`.
        max_recompiles_per_epoch: more recompiles than this in one epoch (train or validation) is churn.
        first_epoch: the epoch the run (or the resumed run) started in; its recompiles are warm-up.
    """

    def __init__(self, policy: str, *, max_recompiles_per_epoch: int, first_epoch: int = 0) -> None:
        self.policy = policy
        self.max_recompiles_per_epoch = max_recompiles_per_epoch
        self.first_epoch = first_epoch
        # Shape recompiles each (region, stage) is expected to make, in any epoch: one static graph per
        # padding bucket (set by the callback when it compiles the buckets static).
        self.shape_budget = 0
        self.handled: set[tuple[str, str]] = set()
        self.actions: list[ChurnAction] = []
        self.frozen_at_step: int | None = None  # global step at which a searched plan froze
        self._seen = (0, 0)  # recompiles and fallbacks judged so far

    def judge(
        self, recompiles: list[Recompile], fallbacks: list[tuple[str, str]], *, searched: bool, frozen: bool, step: int
    ) -> list[ChurnAction]:
        """:meth:`check` behind the frozen-plan gate. A searched plan's own trials recompile (a new mode is
        a new backend), so only the frozen plan's recompiles are judged, from the step it froze at, and
        nothing is acted on in the middle of a trial. Nothing new since the last call: no actions."""
        if searched:
            if not frozen:
                return []
            if self.frozen_at_step is None:
                self.frozen_at_step = step
        if (len(recompiles), len(fallbacks)) == self._seen:
            return []
        self._seen = (len(recompiles), len(fallbacks))
        if self.frozen_at_step is not None:
            recompiles = [r for r in recompiles if r.step >= self.frozen_at_step]
        return self.check(recompiles, fallbacks)

    def check(self, recompiles: Iterable[Recompile], fallbacks: Iterable[tuple[str, str]] = ()) -> list[ChurnAction]:
        """New actions for the recompiles and eager fallbacks seen so far (each cause acted on once).

        Args:
            recompiles: every recompile of the run so far.
            fallbacks: ``(region, reason)`` for each region that hit the recompile limit.
        """
        recompiles = self._beyond_the_buckets(list(recompiles))
        per_epoch = Counter((r.stage, r.epoch) for r in recompiles)
        new: list[ChurnAction] = []
        for region, reason in fallbacks:
            new += self._once(region, reason, SHAPE if "size(" in reason else "other", "hit the recompile limit and now runs eager")
        for recompile in recompiles:
            count = per_epoch[(recompile.stage, recompile.epoch)]
            if recompile.stage == "train" and recompile.epoch > self.first_epoch:
                why = f"recompiled in epoch {recompile.epoch}, after the first"
            elif count > self.max_recompiles_per_epoch:
                why = f"{count} recompiles in {recompile.stage} epoch {recompile.epoch} (max_recompiles_per_epoch={self.max_recompiles_per_epoch})"
            else:
                continue
            new += self._once(recompile.region, recompile.reason, recompile.kind, why)
        return new

    def _beyond_the_buckets(self, recompiles: list[Recompile]) -> list[Recompile]:
        """The recompiles left once each (region, stage)'s first ``shape_budget`` shape recompiles, the
        padding buckets' own static graphs, are set aside (whichever epoch a bucket first shows up in)."""
        if not self.shape_budget:
            return recompiles
        seen: Counter[tuple[str, str]] = Counter()
        left = []
        for recompile in recompiles:
            if recompile.kind == SHAPE:
                seen[(recompile.region, recompile.stage)] += 1
                if seen[(recompile.region, recompile.stage)] <= self.shape_budget:
                    continue
            left.append(recompile)
        return left

    def adopt(self, action: ChurnAction) -> bool:
        """Takes on an action decided elsewhere (another rank's), so its cause is not acted on again
        here; False if this cause was handled already."""
        key = _key(action.region, action.cause)
        if key in self.handled:
            return False
        self.handled.add(key)
        self.actions.append(action)
        return True

    def _once(self, region: str, cause: str, kind: str, why: str) -> list[ChurnAction]:
        action = ChurnAction(self.policy, region, cause, kind, why)
        return [action] if self.adopt(action) else []


def _key(region: str, cause: str) -> tuple[str, str]:
    """One action per changing thing: "`x.size(1)` changed 512 → 640" and "... 640 → 768" are one cause."""
    return region, cause.split(" changed")[0]


def same_cause(first: ChurnAction, second: ChurnAction) -> bool:
    return _key(first.region, first.cause) == _key(second.region, second.cause)
