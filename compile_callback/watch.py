"""CompileWatch: dynamo's own accounting of graphs, graph breaks, recompiles and compile time, per region.

Every compile dynamo starts is attributed to the innermost region (or, for code the user compiled
themselves, the innermost named submodule) on the Python stack of the call that triggered it. A lazily
compiled backward inherits the region of the forward with the same compile id. Counts come from
dynamo's own counters and records, so they equal what ``torch._dynamo`` reports.

Graph breaks are every break dynamo records (``graph_break_reasons``: one a frame it cuts, the breaks
``TORCH_LOGS=graph_breaks`` prints), sorted into kinds, because dynamo's ``counters["graph_break"]``
holds one kind only: breaks at an instruction it cannot trace and resumes after (a call, mostly). A
data-dependent branch, and a break it cannot resume from (it compiles up to the last point it can
resume at, reason ``step_unsupported``, and runs the rest of the function eagerly), it counts in
``counters["unimplemented"]``, among errors that are no breaks. A tiny Hugging Face GPT-2 (torch 2.14.1,
transformers 5.24) shows 5: the ``logger.warning_once`` in its ``loss_function`` property cuts each of
the five frames it runs under, four at a call (``counters["graph_break"]`` = 4) and
``GPT2LMHeadModel.forward`` at its read of the property, which dynamo cannot resume after.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter, defaultdict
from typing import Any

from compile_callback import torch_internals
from compile_callback.regions import region_name
from compile_callback.torch_internals import CompileEvent, CompileRecord, GraphBreak

UNATTRIBUTED = "(unattributed)"


def twin_of(region: str) -> str:
    """Where the compiles of a region's verification twin are counted (``verify.verify_module``: a region
    that draws random numbers is verified on a twin, dropout off, and trains on its own graph), and the
    recompiles its own graph makes in that step below a graph break, where the twin's graph was cached
    first (dropout's ``p`` changed from 0.0, or another backend): dynamo's counts, apart from the region's
    churn (never in ``recompiles`` or a per-epoch count)."""
    return f"{region}{_TWIN}"


_TWIN = " (verification twin)"


def is_twin(name: str) -> bool:
    """Whether a name in the compile accounting is a verification twin's (:func:`twin_of`)."""
    return name.endswith(_TWIN)

_SIZE_MISMATCH = re.compile(r"tensor '(.+?)' (size|stride) mismatch at index (\d+)\. expected (\d+), actual (\d+)")
_VALUE_GUARD = re.compile(r"^(?P<subject>[\w\.\[\]'\"]+) == (?P<value>\S+)\s*(#\s*(?P<code>.*?)\s*#\s*(?P<where>\S+:\d+ in \w+))?")
_COMPILE_ID_PREFIX = re.compile(r"^\s*!?\d+/\d+(_\d+)?:\s*")

# Kinds of graph break, told apart by the reason dynamo gives (checked on torch 2.14.1):
# a call, or another instruction dynamo breaks at and resumes after (an attribute or subscript store, a
# subscript, a comparison): the one kind dynamo's counters["graph_break"] counts
AT_CALL = "call"
DATA_DEPENDENT_BRANCH = "data-dependent branch"  # dynamo's reason "generic_jump ..."
NO_RESUME_POINT = "no resume point"  # "step_unsupported"
COMPREHENSION = "comprehension"  # "comprehension_graph_break" (Python 3.12+; not seen here)
GRAPH_BREAK_KINDS = (AT_CALL, DATA_DEPENDENT_BRANCH, NO_RESUME_POINT, COMPREHENSION)
UNCLASSIFIED = "unclassified"  # breaks loaded from a checkpoint written before kinds were kept
_KIND_BY_REASON_PREFIX = {
    "generic_jump": DATA_DEPENDENT_BRANCH,
    "step_unsupported": NO_RESUME_POINT,
    "comprehension_graph_break": COMPREHENSION,
}
# What the report says about each kind dynamo does not count in counters["graph_break"].
_KIND_NOTES = {
    DATA_DEPENDENT_BRANCH: "data-dependent branch (dynamo counts it in counters['unimplemented'], "
    "not counters['graph_break'])",
    NO_RESUME_POINT: "a graph break dynamo cannot resume from: compiled up to here and ran the rest of the "
    "function eagerly (counted in counters['unimplemented'], not counters['graph_break'])",
    COMPREHENSION: "a graph break in a comprehension (not counted in counters['graph_break'])",
}

SHAPE = "shape"
BACKEND_MATCH = "BACKEND_MATCH"  # dynamo's guard on the backend a frame was compiled with
PYTHON_VALUE = "python value"
OTHER = "other"


def classify_guard_failure(reason: str) -> tuple[str, str]:
    """Dynamo's guard-failure text as (kind, readable text).

    Kinds: ``"shape"`` ("`x.size(1)` changed 512 → 640"), ``"python value"`` (an int or other Python
    value the code reads changed: "`self.n` (a Python value) changed from 3, read at file:line"), or
    ``"other"`` (dynamo's own first line, e.g. a requires_grad or dtype change).
    """
    text = _COMPILE_ID_PREFIX.sub("", torch_internals.first_line(reason))
    match = _SIZE_MISMATCH.search(text)
    if match:
        name, kind, index, expected, actual = match.groups()
        return SHAPE, f"`{name}.{kind}({index})` changed {expected} → {actual}"
    if text.startswith("GLOBAL_STATE changed: grad_mode"):
        return OTHER, "grad mode changed (validation and inference run under no_grad): one more graph"
    match = _VALUE_GUARD.match(text)
    if match:
        where = f", read at {match.group('where')}" if match.group("where") else ""
        return PYTHON_VALUE, f"`{match.group('subject')}` (a Python value) changed from {match.group('value')}{where}"
    return OTHER, text


def graph_break_kind(reason: str) -> str:
    """The kind of a graph break from dynamo's reason for it: one of :data:`GRAPH_BREAK_KINDS`.

    Every reason but dynamo's fixed words for a branch, a missing resume point or a comprehension is
    the message of an unsupported instruction it resumed after, the kind ``counters["graph_break"]``
    counts (:data:`AT_CALL`).
    """
    for prefix, kind in _KIND_BY_REASON_PREFIX.items():
        if reason.startswith(prefix):
            return kind
    return AT_CALL


def describe_graph_break(reason: str, location: str) -> str:
    """A graph break for the report: dynamo's reason and where, with what its kind means when
    ``counters["graph_break"]`` does not count it."""
    note = _KIND_NOTES.get(graph_break_kind(reason))
    return f"{reason}: {note} ({location})" if note else f"{reason} ({location})"


def readable_guard_failure(reason: str) -> str:
    """The readable text of :func:`classify_guard_failure`."""
    return classify_guard_failure(reason)[1]


@dataclasses.dataclass
class Recompile:
    """A recompile and the guard that failed, in the words dynamo gives it."""

    region: str
    reason: str
    stage: str
    epoch: int
    step: int
    kind: str = OTHER

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class RegionCompileStats:
    """What dynamo did for one region, cumulative over the run."""

    graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0  # every break dynamo recorded; graph_break_kinds splits them
    ddp_pieces: int = 0  # pieces DDPOptimizer split graphs into at DDP's gradient buckets (not graph breaks)
    compile_seconds: float = 0.0
    dynamo_seconds: float = 0.0  # capture alone: dynamo's time less AOTAutograd's
    aot_autograd_seconds: float = 0.0  # AOTAutograd alone: its time less Inductor's
    inductor_seconds: float = 0.0  # Inductor, forward and (lazily compiled) backward graphs
    cache_hits: int = 0
    cache_misses: int = 0
    guard_latencies_us: list[float] = dataclasses.field(default_factory=list)  # torch's, one per graph
    eager_fallback: bool = False
    fallback_reason: str | None = None
    graph_break_reasons: Counter = dataclasses.field(default_factory=Counter)
    # kind -> breaks (GRAPH_BREAK_KINDS); only AT_CALL is in dynamo's counters["graph_break"]
    graph_break_kinds: Counter = dataclasses.field(default_factory=Counter)
    recompile_reasons: Counter = dataclasses.field(default_factory=Counter)
    compile_errors: list[str] = dataclasses.field(default_factory=list)
    # Recompiles the callback caused itself by compiling the region's code again with another mode or backend
    # (a trial after a trial): dynamo's BACKEND_MATCH guard. Never churn, never in ``recompiles``.
    retry_recompiles: int = 0

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["graph_break_reasons"] = [
            {"reason": reason, "count": count} for reason, count in self.graph_break_reasons.most_common()
        ]
        data["recompile_reasons"] = [
            {"reason": reason, "count": count} for reason, count in self.recompile_reasons.most_common()
        ]
        data["graph_break_kinds"] = dict(self.graph_break_kinds)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RegionCompileStats:
        fields = {f.name for f in dataclasses.fields(cls)}
        counters = ("graph_break_reasons", "recompile_reasons", "graph_break_kinds")
        stats = cls(**{k: v for k, v in data.items() if k in fields and k not in counters})
        stats.graph_break_reasons = Counter(
            {item["reason"]: item["count"] for item in data.get("graph_break_reasons", [])}
        )
        stats.recompile_reasons = Counter(
            {item["reason"]: item["count"] for item in data.get("recompile_reasons", [])}
        )
        # A checkpoint from before kinds were kept: its breaks stay counted, of no known kind.
        kinds = data.get("graph_break_kinds", {UNCLASSIFIED: stats.graph_breaks} if stats.graph_breaks else {})
        stats.graph_break_kinds = Counter(kinds)
        return stats


class CompileWatch:
    """Listens to dynamo's compile hooks and keeps per-region, per-epoch accounting.

    Args:
        region_by_module_id: ``id(module) -> region name`` for the regions this package compiled.
        name_by_module_id: ``id(module) -> qualified name`` for every submodule of the model, used to
            name code the user compiled themselves.

    Example:
        >>> watch = CompileWatch(region_by_module_id, name_by_module_id)
        >>> watch.start()
        >>> ...  # run steps
        >>> watch.collect()
    """

    def __init__(self, region_by_module_id: dict[int, str], name_by_module_id: dict[int, str]) -> None:
        self.region_by_module_id = dict(region_by_module_id)
        self.name_by_module_id = dict(name_by_module_id)
        self.stats: dict[str, RegionCompileStats] = defaultdict(RegionCompileStats)
        self.recompiles: list[Recompile] = []
        self.graph_breaks: list[tuple[str, GraphBreak]] = []
        self.epoch_recompiles: Counter = Counter()  # (stage, epoch) -> count
        self.stage = "train"
        self.epoch = 0
        self.step = 0
        self.compiles_seen = 0
        self._region_of_compile: dict[str, str | None] = {}
        self._region_of_frame: dict[int, str] = {}
        self._open: dict[str, tuple[int, int]] = {}
        self._handles: tuple[Any, Any] | None = None
        self._marker: object | None = None
        self._dirty = False
        self._after_twin: dict[str, int] = {}  # region -> the step its verification twin ran in

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Starts listening (idempotent; re-installs after ``torch._dynamo.reset()`` cleared the hooks)."""
        if self._handles is not None and torch_internals.compile_hooks_installed(self._handles):
            return
        if self._handles is None:
            self._marker = torch_internals.compile_record_count_marker()
        self._handles = torch_internals.install_compile_hooks(self._on_start, self._on_end)

    def stop(self) -> None:
        if self._handles is not None:
            self.collect()
            torch_internals.remove_compile_hooks(self._handles)
            self._handles = None

    def add_region(self, region: Any) -> None:
        """Attributes compiles under ``region``'s modules to ``region.name`` from now on."""
        for module in region.modules:
            self.region_by_module_id[id(module)] = region.name

    def set_phase(self, *, stage: str, epoch: int, step: int) -> None:
        self.stage, self.epoch, self.step = stage, epoch, step

    @property
    def compiled_since_collect(self) -> bool:
        """True when a compile started since the last :meth:`collect`: the step that ran it is not steady."""
        return self._dirty

    @property
    def idle(self) -> bool:
        """True when :meth:`collect` has nothing to read: no compile hook fired and dynamo made no record since."""
        return not self._dirty and torch_internals.compile_record_count_marker() is self._marker

    # -- dynamo hooks ----------------------------------------------------------------------------
    def _attribute_from_stack(self) -> str | None:
        frame = sys._getframe(2)
        fallback = None
        while frame is not None:
            owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
            if owner is not None:
                key = id(owner)
                if key in self.region_by_module_id:
                    return self.region_by_module_id[key]
                if fallback is None and key in self.name_by_module_id:
                    # Named as the planner names regions: a child called `model` is not the whole model.
                    fallback = region_name(self.name_by_module_id[key])
            frame = frame.f_back
        return fallback

    def _on_start(self, event: CompileEvent) -> None:
        try:
            self._start(event)
        except Exception as error:  # a watch must never break a compile
            self._note_failure(error)

    def _on_end(self, event: CompileEvent) -> None:
        try:
            self._end(event)
        except Exception as error:
            self._note_failure(error)

    def _note_failure(self, error: Exception) -> None:
        self.stats[UNATTRIBUTED].compile_errors.append(f"compile watch: {type(error).__name__}: {error}")

    def _start(self, event: CompileEvent) -> None:
        self._dirty = True
        if event.trigger == "DYNAMO":
            self.compiles_seen += 1
            region = self._attribute_from_stack()
            if torch_internals.twin_running():
                # The region's own recompiles in this step are the twin's doing (see twin_of).
                self._after_twin[region or UNATTRIBUTED] = self.step
                region = twin_of(region or UNATTRIBUTED)
            self._region_of_compile[event.compile_id] = region
            # A twin compiles frames below a graph break first; they belong to the region that trains on them.
            if region is not None and event.frame_id is not None and not torch_internals.twin_running():
                self._region_of_frame.setdefault(event.frame_id, region)
        self._open[event.compile_id] = (torch_internals.unique_graphs(), torch_internals.graph_break_count())

    def _end(self, event: CompileEvent) -> None:
        graphs_before, breaks_before = self._open.pop(event.compile_id, (None, None))
        if graphs_before is None:
            return
        region = self._region_of_compile.get(event.compile_id) or UNATTRIBUTED
        stats = self.stats[region]
        stats.graphs += torch_internals.unique_graphs() - graphs_before
        for graph_break in torch_internals.graph_breaks_since(breaks_before):
            if graph_break.ddp_split:
                stats.ddp_pieces += 1
                continue
            stats.graph_breaks += 1
            stats.graph_break_kinds[graph_break_kind(graph_break.reason)] += 1
            stats.graph_break_reasons[describe_graph_break(graph_break.reason, graph_break.location)] += 1
            self.graph_breaks.append((region, graph_break))

    # -- records ---------------------------------------------------------------------------------
    def collect(self) -> list[CompileRecord]:
        """Reads dynamo's compile records since the last call; call after any step that compiled."""
        # A compile refused at the recompile limit fires no hook, only a record: look for new records
        # even when no hook fired (one identity check on the newest record: no per-step cost to speak of).
        if self.idle:
            return []
        self._dirty = False
        records = torch_internals.records_after(self._marker)
        self._marker = torch_internals.compile_record_count_marker()
        for record in records:
            region = self._region_of_compile.get(record.compile_id)
            if region is None:
                # A compile refused before it started (the recompile limit) fires no start hook; it
                # belongs to the region that compiled the same code object (same frame id) before.
                frame_id, _ = torch_internals.parse_compile_id(record.compile_id)
                region = self._region_of_frame.get(frame_id) if frame_id is not None else None
            if region is None:
                region = self._name_for_unknown(record)
                self._region_of_compile[record.compile_id] = region
            stats = self.stats[region]
            stats.compile_seconds += record.seconds
            # torch's figures nest (dynamo's includes AOTAutograd's, which includes Inductor's forward);
            # the split keeps each stage's own time, so the three add up to the compile time.
            if record.is_forward:
                stats.dynamo_seconds += max(0.0, record.dynamo_seconds - record.aot_autograd_seconds)
            if record.aot_autograd_seconds:
                stats.aot_autograd_seconds += max(0.0, record.aot_autograd_seconds - record.inductor_seconds)
            stats.inductor_seconds += record.inductor_seconds
            stats.cache_hits += record.fx_cache_hits
            stats.cache_misses += record.fx_cache_misses
            if record.guard_latency_us is not None and record.is_forward:
                stats.guard_latencies_us.append(float(record.guard_latency_us))
            twins = is_twin(region) or self._after_twin.get(region) == self.step
            if record.recompile_reason and record.is_forward and twins:
                twin = self.stats[region if is_twin(region) else twin_of(region)]
                twin.recompiles += 1
                twin.recompile_reasons[readable_guard_failure(record.recompile_reason)] += 1
            elif record.recompile_reason and record.is_forward and BACKEND_MATCH in record.recompile_reason:
                stats.retry_recompiles += 1
            elif record.recompile_reason and record.is_forward:
                kind, reason = classify_guard_failure(record.recompile_reason)
                stats.recompiles += 1
                stats.recompile_reasons[reason] += 1
                self.recompiles.append(Recompile(region, reason, self.stage, self.epoch, self.step, kind))
                self.epoch_recompiles[(self.stage, self.epoch)] += 1
            if record.hit_recompile_limit:
                stats.eager_fallback = True
                where = f" in {record.code_name} ({record.code_location})" if record.code_name else ""
                stats.fallback_reason = (
                    f"hit torch._dynamo.config.recompile_limit ({torch_internals.recompile_limit()}){where}; last "
                    f"guard failure: {readable_guard_failure(record.recompile_reason or '') or 'unknown'}"
                )
            elif record.fail_type and record.is_forward:
                stats.compile_errors.append(f"{record.fail_type}: {torch_internals.first_line(record.fail_reason or '')}")
        return records

    def _name_for_unknown(self, record: CompileRecord) -> str:
        if record.code_name:
            return f"{record.code_name} ({record.code_location})"
        return UNATTRIBUTED

    # -- totals ----------------------------------------------------------------------------------
    def totals(self) -> dict[str, float]:
        stats = list(self.stats.values())
        return {
            "graphs": sum(s.graphs for s in stats),
            "recompiles": sum(s.recompiles for s in stats),
            "graph_breaks": sum(s.graph_breaks for s in stats),
            # The part of graph_breaks that dynamo's counters["graph_break"] counts (its values summed).
            "graph_breaks_in_dynamo_counter": sum(s.graph_break_kinds[AT_CALL] for s in stats),
            "ddp_pieces": sum(s.ddp_pieces for s in stats),
            "compile_time_s": sum(s.compile_seconds for s in stats),
            "eager_fallbacks": sum(1 for s in stats if s.eager_fallback),
        }

    def recompiles_in(self, stage: str, epoch: int) -> int:
        return self.epoch_recompiles[(stage, epoch)]

    # -- resume ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "stats": {name: stats.as_dict() for name, stats in self.stats.items()},
            "recompiles": [recompile.as_dict() for recompile in self.recompiles],
            "epoch_recompiles": [[stage, epoch, count] for (stage, epoch), count in self.epoch_recompiles.items()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = defaultdict(RegionCompileStats)
        for name, data in state.get("stats", {}).items():
            self.stats[name] = RegionCompileStats.from_dict(data)
        self.recompiles = [Recompile(**item) for item in state.get("recompiles", [])]
        self.epoch_recompiles = Counter(
            {(stage, epoch): count for stage, epoch, count in state.get("epoch_recompiles", [])}
        )
