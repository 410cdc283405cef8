"""CompileConfig: every option of ``CompileCallback``, checked once, frozen.

The callback's keyword arguments land here unchanged (LightningCLI builds the callback from its
signature); each is checked with a message that says what is allowed. Lists become tuples, so a
config cannot change under a fit. Nothing here imports Lightning.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

from compile_callback import torch_internals
from compile_callback.churn import ON_RECOMPILE_POLICIES
from compile_callback.padding import PAD_STRATEGIES
from compile_callback.regions import (
    BACKENDS_WITH_MODES, BACKENDS_WITHOUT_OPTIONS, MODEL, MODES, CompileOptions, backend_name,
)

AUTO = "auto"
SHORT_BATCH_MODES = ("keep", "pad")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}; got {value!r}.")


def _check_float(name: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ValueError(f"`{name}` must be a number >= {minimum}; got {value!r}.")


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    """What ``CompileCallback``'s arguments mean is documented there; this holds and checks them."""

    regions: str | tuple[str, ...] = AUTO
    backend: str | Callable[..., Any] = "inductor"
    mode: str = AUTO
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    eager_baseline_steps: int = 10
    warmup_steps: int = 3
    trial_steps: int = 20
    min_speedup: float = 1.03
    max_trials: int = 6
    verify: bool = True
    verify_tolerance: float | None = None
    on_recompile: str = "warn"
    max_recompiles_per_epoch: int = 4
    pad: str | tuple[int, ...] | None = None
    pad_max_buckets: int = 8
    pad_multiple: int = 8
    pad_short_batch: str = "keep"
    cache_dir: str | None = None
    log_every_n_steps: int | None = None
    report: bool = True
    anatomy: bool | None = None
    background_compile: bool | None = None

    def __post_init__(self) -> None:
        self._check_regions()
        self._check_compile_arguments()
        self._check_counts()
        self._check_padding()
        if self.background_compile is not None and not isinstance(self.background_compile, bool):
            raise ValueError(
                f"`background_compile` must be True, False or None (where it can pay); got {self.background_compile!r}."
            )
        if self.cache_dir is not None and (not isinstance(self.cache_dir, str) or not self.cache_dir):
            raise ValueError(f"`cache_dir` must be a directory path or None; got {self.cache_dir!r}.")
        # Frozen: normalized copies are set through object.__setattr__.
        if isinstance(self.regions, list):
            object.__setattr__(self, "regions", tuple(self.regions))
        if isinstance(self.pad, list):
            object.__setattr__(self, "pad", tuple(self.pad))
        object.__setattr__(self, "min_speedup", float(self.min_speedup))
        if self.options is not None:
            object.__setattr__(self, "options", dict(self.options) or None)

    def _check_regions(self) -> None:
        regions = self.regions
        if isinstance(regions, str):
            if regions not in (AUTO, MODEL):
                raise ValueError(
                    f"`regions` must be 'auto', 'model' or a list of submodule names or glob patterns; "
                    f"got {regions!r}. To compile one submodule, pass a list: regions=[{regions!r}]."
                )
        elif isinstance(regions, (list, tuple)) and regions and all(isinstance(r, str) and r for r in regions):
            if len(set(regions)) != len(regions):
                raise ValueError(f"`regions` names a region twice: {list(regions)!r}. Give each once.")
            if AUTO in regions:
                raise ValueError("`regions` can be 'auto' or a list of names, not a list containing 'auto'.")
        else:
            raise ValueError(
                f"`regions` must be 'auto', 'model' or a non-empty list of submodule names; got {regions!r}."
            )

    def _check_compile_arguments(self) -> None:
        backend, mode, options = self.backend, self.mode, self.options
        if not callable(backend) and (not isinstance(backend, str) or not backend):
            raise ValueError(f"`backend` must be a torch.compile backend name such as 'inductor', a dotted import "
                             f"path to a backend function, or a callable; got {backend!r}.")
        allowed_modes = (AUTO, *MODES)
        if mode not in allowed_modes:
            raise ValueError(f"`mode` must be one of {', '.join(repr(m) for m in allowed_modes)}; got {mode!r}.")
        if mode not in (AUTO, "default") and backend not in BACKENDS_WITH_MODES:
            raise ValueError(f"`mode={mode!r}` needs backend='inductor'; got backend={backend!r}.")
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"`options` must be a dict of inductor options or None; got {options!r}.")
        if options and isinstance(backend, str) and backend in BACKENDS_WITHOUT_OPTIONS:
            raise ValueError(f"`options` are Inductor's and backend={backend!r} drops them; use backend='inductor' "
                             f"or leave `options` out.")
        if options and mode not in (AUTO, "default"):
            raise ValueError(
                "`options` and `mode` cannot be given together (torch.compile refuses both); "
                "set mode='default' or put the mode's settings into `options`."
            )
        if not isinstance(self.fullgraph, bool):
            raise ValueError(f"`fullgraph` must be True or False; got {self.fullgraph!r}.")
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise ValueError(f"`dynamic` must be True, False or None; got {self.dynamic!r}.")
        for flag_name in ("verify", "report"):
            if not isinstance(getattr(self, flag_name), bool):
                raise ValueError(f"`{flag_name}` must be True or False; got {getattr(self, flag_name)!r}.")
        if self.anatomy is not None and not isinstance(self.anatomy, bool):
            raise ValueError(f"`anatomy` must be True, False or None (on CPU only); got {self.anatomy!r}.")
        if self.verify_tolerance is not None:
            _check_float("verify_tolerance", self.verify_tolerance, 0.0)
            if not self.verify:
                raise ValueError(f"`verify_tolerance={self.verify_tolerance!r}` has no effect with verify=False (nothing "
                                 "is compared); drop one of the two.")
        if self.on_recompile not in ON_RECOMPILE_POLICIES:
            raise ValueError(
                f"`on_recompile` must be one of {', '.join(repr(p) for p in ON_RECOMPILE_POLICIES)}; "
                f"got {self.on_recompile!r}."
            )

    def _check_counts(self) -> None:
        _check_int("eager_baseline_steps", self.eager_baseline_steps, 0)
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_int("trial_steps", self.trial_steps, 1)
        _check_int("max_trials", self.max_trials, 0)
        _check_float("min_speedup", self.min_speedup, 1.0)
        _check_int("max_recompiles_per_epoch", self.max_recompiles_per_epoch, 0)
        if self.regions == AUTO and self.eager_baseline_steps < 2:
            raise ValueError(
                f"`eager_baseline_steps` must be >= 2 with regions='auto' (trials are measured against "
                f"it); got {self.eager_baseline_steps}. Use explicit regions to compile without a baseline."
            )
        if self.log_every_n_steps is not None:
            _check_int("log_every_n_steps", self.log_every_n_steps, 1)

    def _check_padding(self) -> None:
        pad = self.pad
        if pad is not None and not (
            pad in PAD_STRATEGIES
            or (isinstance(pad, (list, tuple)) and pad
                and all(isinstance(e, int) and not isinstance(e, bool) and e > 0 for e in pad))
        ):
            raise ValueError(
                f"`pad` must be None, 'auto', 'max' or a list of positive sizes (bucket edges); got {pad!r}."
            )
        _check_int("pad_max_buckets", self.pad_max_buckets, 1)
        _check_int("pad_multiple", self.pad_multiple, 1)
        if self.pad_short_batch not in SHORT_BATCH_MODES:
            raise ValueError(f"`pad_short_batch` must be 'keep' or 'pad'; got {self.pad_short_batch!r}.")

    def given(self, name: str) -> Any:
        """An option as the user gave it: the tuples this frozen config keeps are lists again."""
        value = getattr(self, name)
        return list(value) if isinstance(value, tuple) else value

    @property
    def region_names(self) -> list[str]:
        """The names to resolve for fixed regions (``"model"``: the whole LightningModule)."""
        return [MODEL] if self.regions == MODEL else list(self.regions)

    def check_inductor_options(self, backend: str | Callable[..., Any]) -> None:
        """``options`` names checked against Inductor's before training (torch.compile checks them only at
        the first compile, after training started).

        Raises:
            ValueError: unknown option names, each with the closest known ones.
        """
        if not self.options or backend != "inductor":
            return
        known = torch_internals.inductor_option_names()
        unknown = sorted(name for name in self.options if name not in known)
        if unknown:
            hints = {name: difflib.get_close_matches(name, sorted(known), n=3) for name in unknown}
            detail = "; ".join(f"{name!r} (close: {', '.join(close) or 'none'})" for name, close in hints.items())
            raise ValueError(f"`options` names Inductor options that do not exist: {detail}. Use names from "
                             f"torch._inductor.list_options(), dotted for nested ones ('triton.cudagraphs').")

    def compile_options(self, backend: str | Callable[..., Any]) -> CompileOptions:
        """What every region is compiled with (``backend`` resolved: a dotted path imported)."""
        return CompileOptions(
            backend=backend, mode=None if self.mode == AUTO else self.mode, fullgraph=self.fullgraph,
            dynamic=self.dynamic, options=self.options,
        )

    def plan_options(self) -> dict[str, Any]:
        """The arguments a plan is chosen under: a checkpoint's plan chosen under others is chosen again. Named
        regions are chosen by name, not by trials: ``min_speedup`` and ``verify`` do not choose them. The plan
        cache's key holds these, its ``pad`` the fit's (:meth:`cache_options`)."""
        chosen = {
            "regions": self.given("regions"),
            "backend": backend_name(self.backend), "mode": self.mode, "fullgraph": self.fullgraph,
            "dynamic": self.dynamic, "options": self.options,
        }
        if self.regions == AUTO:
            chosen.update(min_speedup=self.min_speedup, verify=self.verify)
        chosen["pad"] = self.given("pad")  # the shapes it was measured and compiled on
        return chosen

    def cache_options(self, pad: str | list[int] | None) -> dict[str, Any]:
        """What a cached plan's key holds beside the model: a plan measured under other options is not reused.
        ``pad`` is the fit's (the churn policy may have turned padding on)."""
        return {
            **self.plan_options(),
            # Padding changes the shapes the plan was measured on (and makes regions static).
            "pad": pad, "pad_max_buckets": self.pad_max_buckets,
            "pad_multiple": self.pad_multiple,
        }
