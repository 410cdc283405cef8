"""A compile beside the run: a child process fills Inductor's caches while training goes on (issue 22).

A trial stops the training loop while its candidate compiles (GPT-2 124M, the whole model: 21 s cold on
the H200). With a background compile the trial starts a child process instead and keeps training with
the plan before the candidate; the child compiles a copy of the candidate into the run's Inductor cache
(FX-graph and AOTAutograd caches, the same directory), and when it is done the trial compiles the
candidate here from that warm cache (the H200 measured 1.4 s for GPT-2 against 21 s cold), then verifies
and measures it as every trial does.

What the child gets, so that its compile keys the caches as the trial's own compile will:
- a pickled copy of the candidate's first module (a group of repeated blocks compiles one block's code
  for all) and the input the profiler held for it, moved to the same device with the same strides;
- dynamo's, AOTAutograd's and Inductor's configuration, the matmul/cuDNN/attention backend flags, the
  deterministic-algorithms setting and the autocast and default dtype of the training step's forward, as they
  are now;
- the same calls: :func:`~compile_callback.regions.compile_region`, then the run verification makes
  (:func:`~compile_callback.verify.verify_module`: an eager and a compiled forward and backward, so the
  backward is compiled too; a region with active dropout is verified on a twin, so the child then runs
  the module's own compiled forward and backward as well, the graph the run trains on).
The child's verification stands for the trial's own where the trial's compile came whole from the
child's cache (the same compiled code, checked on the same input): the trial then only runs its compiled
forward and backward once, to load them. On the H200 the trial's own verification of GPT-2's whole model
took 22 s of stopped training, 17 s of it the fp32 reference (its activations kept in host memory),
against 1.3 s for the warm compile.
The child is a fresh interpreter (``python compile_callback/boot.py``, which runs this module: never a fork
of a process that holds CUDA, and it does not re-run the user's script), so the module's classes must be importable
(a class defined in the script's ``__main__`` is not). Rank 0's first child runs on a :class:`Standby`,
an interpreter started at the fit's setup that has done its imports and waits, idle, for the payload; and a
child exits without the interpreter's teardown once its result is written, which the run waited through.

Every way it can fail leaves the trial as it was without it, compiling here, with the reason in the
report's decision: a module or input that does not pickle, too little free device memory for a second
copy of the step (the child needs about what the eager step needed), a child that fails or runs past
its time limit, a compile the cache did not serve (the decision's cache state says ``cold``). It is on
by default (``background_compile=None``) only where it can pay: one process on a CUDA device, an
Inductor backend given by name, Inductor's FX-graph cache on. Several processes (DDP) use it only where
asked for (``background_compile=True``). Inductor's cache key holds the inputs' device, so ranks on
distinct GPUs each start a child for their own device, and ranks that share one (CPU processes) leave it
to rank 0's; the ranks agree every ``POLL_EVERY`` batches whether every child is done, then each compiles
from its host's cache (a rank whose key no child filled compiles cold: its cache state says so). No
child's verification stands there: each rank verifies its own compile on its own batch, as always.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from compile_callback import boot, torch_internals
from compile_callback.regions import CompileOptions, Region, backend_name, compile_region
from compile_callback.verify import VerificationResult

CHILD_TIME_LIMIT_S = 900.0  # a child still compiling after this is stopped; the trial compiles here
# The child's CPU priority below the run's (os.nice): its compile (Inductor's workers inherit it) takes the
# cores training leaves idle and yields the rest. On a 2-core CPU oversubscribed (a test suite beside it),
# eager steps beside a plain child ran 63-106% slower, beside a niced one -15 to +16% (its compile 1.7-4x
# longer); with a core to spare neither slowed them (the niced compile 13% longer). On the H200 (16 cores,
# a child's 16 compile workers) eager steps ran 11% slower beside a plain child once (GPT-2, 2026-12-02); in
# session 17's controlled runs (benchmarks/diagnostics/child.py) neither child slowed them (ResNet-50 29.8 ms,
# ResNet-18 CIFAR 8.0 ms a step) and niceness barely moved the child (ResNet-50: 70 s at 10, 75 s at 0).
CHILD_NICENESS = 10
NICENESS_VARIABLE = "COMPILE_CALLBACK_CHILD_NICENESS"  # overrides CHILD_NICENESS (0: the run's own priority)
# The CPUs a child and its compile workers may run on ("8-15", "2,3,6-7"): unset, those the run may use. For
# hosts where a busy CPU slows another (hyperthreads that the guest sees as cores), to keep the child off
# the cores training runs on.
CPUS_VARIABLE = "COMPILE_CALLBACK_CHILD_CPUS"
# How long a killed child is waited for. One in an uninterruptible call (the GPU driver) cannot exit until
# it returns: the fit goes on without it, and the kill takes effect when the call returns.
KILL_WAIT_S = 10.0
MEMORY_MARGIN_BYTES = 2 * 2**30  # the child's CUDA context and allocator slack beside the step itself
POLL_EVERY = 10  # batches between the ranks' agreements on whether rank 0's child is done (one process: every batch)
_RESULT = "COMPILE_CALLBACK_RESULT "  # the child's last line starts with it, a JSON summary after
_STAGE = "COMPILE_CALLBACK_STAGE "  # a line of the child's as each of its stages starts: the stage, the wall clock
STANDBY = "--standby"  # the argument that starts a :class:`Standby`
# Where children cache their imports' bytecode when this interpreter writes none (see bytecode_env): a
# folder of this user's in the temporary directory, as Inductor's cache is, kept across runs.
BYTECODE_DIR = os.path.join(tempfile.gettempdir(), f"compile-callback-bytecode-{getattr(os, 'getuid', lambda: 'user')()}")


def child_niceness() -> int:
    """How much below the run's CPU priority the child runs: ``CHILD_NICENESS``, or the environment's
    ``COMPILE_CALLBACK_CHILD_NICENESS`` (0-19) where set, for hosts whose spare cores make it cost nothing."""
    value = os.environ.get(NICENESS_VARIABLE, "").strip()
    if not value:
        return CHILD_NICENESS
    if not value.isdigit() or int(value) > 19:
        raise ValueError(f"{NICENESS_VARIABLE} must be a whole number from 0 (the run's own priority) to 19 "
                         f"(the lowest); got {value!r}. Unset it for the default, {CHILD_NICENESS}.")
    return int(value)


def child_cpus() -> set[int] | None:
    """The CPUs a child may run on from the environment's ``COMPILE_CALLBACK_CHILD_CPUS`` (None: unset, the
    run's own); a list of CPUs and ranges of this machine. They need not be the run's own: a run pinned to
    some CPUs (``taskset``) can keep its child on others."""
    value = os.environ.get(CPUS_VARIABLE, "").strip()
    if not value or not hasattr(os, "sched_getaffinity"):
        return None
    allowed = set(range(os.cpu_count() or 1))
    cpus: set[int] = set()
    try:
        for part in value.split(","):
            first, dash, last = part.strip().partition("-")
            cpus.update(range(int(first), int(last if dash else first) + 1))
    except ValueError:
        cpus = set()
    if not cpus or not cpus <= allowed:
        raise ValueError(f"{CPUS_VARIABLE} must list CPUs of this machine, as numbers and ranges (\"8-15\", "
                         f"\"2,3,6-7\"), from 0-{max(allowed)}; got {value!r}. Unset it to let the child use the run's own.")
    return cpus


class Unavailable(Exception):
    """Why a candidate cannot be compiled in the background (the trial then compiles in-process)."""


def policy(requested: bool | None, *, device: torch.device, world_size: int, options: CompileOptions) -> str | None:
    """None where background compiles are on for this fit, else why not (for the report).

    ``requested``: the user's ``background_compile`` (None: where it can pay, see the module's text)."""
    if requested is False:
        return "background compile off (background_compile=False)"
    if world_size > 1 and requested is None:
        return (f"background compile off by default for {world_size} processes (background_compile=True: a child "
                "per GPU, or rank 0's where the ranks share a device; on several GPUs not measured yet)")
    if not isinstance(options.backend, str):
        return "background compile needs a backend given by name: a callable cannot be sent to a child process"
    if requested is None:
        if device.type != "cuda":
            return "background compile off on CPU: a child's compile would take the cores training runs on"
        if backend_name(options.backend) != "inductor":
            return f"background compile off for backend {backend_name(options.backend)!r}: only Inductor's caches carry a compile over"
        if not torch_internals.fx_graph_cache_on():
            return "background compile off: Inductor's FX-graph cache is off, so a child's compile could not be reused"
    child_niceness()  # a malformed override stops the fit at its start, not at a trial
    child_cpus()
    return None


def _settings(context: Any, device: torch.device) -> dict[str, Any]:
    """The state a compile depends on, as it is now (the autocast as the training step's forward sets it)."""
    autocast = {}
    with context():
        for device_type in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device_type):
                autocast[device_type] = str(torch.get_autocast_dtype(device_type)).replace("torch.", "")
        # Lightning's "bf16-true" and "16-true" forwards create tensors in the half dtype (its forward_context
        # sets the default dtype); dynamo guards on it, so a child without it compiles a graph the run misses.
        default_dtype = str(torch.get_default_dtype()).replace("torch.", "")
    cuda = torch.backends.cuda
    flags: dict[str, Any] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        # Not cuDNN's benchmark: no compile cache keys it (Inductor calls convolutions through aten, and cuDNN
        # picks their algorithm at run time), and on in a child it times every convolution's algorithms on the
        # GPU the training shares (ResNet-50 on the H200: the child's eager stage 6.2-7.6 s against 0.9-1.1 s).
        "cudnn": {"allow_tf32": torch.backends.cudnn.allow_tf32,
                  "deterministic": torch.backends.cudnn.deterministic, "enabled": torch.backends.cudnn.enabled},
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "matmul": {"allow_tf32": cuda.matmul.allow_tf32,
                   "allow_bf16_reduced_precision_reduction": cuda.matmul.allow_bf16_reduced_precision_reduction,
                   "allow_fp16_reduced_precision_reduction": cuda.matmul.allow_fp16_reduced_precision_reduction},
        "sdp": {name: getattr(cuda, f"{name}_sdp_enabled")() for name in ("flash", "mem_efficient", "math", "cudnn")
                if hasattr(cuda, f"{name}_sdp_enabled")},
        # Newer torch keeps TF32 as fp32_precision ("none", "ieee", "tf32"), in Inductor's cache key; setting
        # a legacy flag turns "none" into "ieee" (a different key: a cache the trial would miss).
        "fp32_precision": {path: _attribute(path).fp32_precision for path in _FP32_PRECISION
                           if hasattr(_attribute(path), "fp32_precision")},
    }
    return {"device": str(device), "autocast": autocast, "default_dtype": default_dtype, "flags": flags,
            "configs": torch_internals.compile_config_snapshot()}


# Where torch keeps an fp32_precision setting (torch 2.9 and later), relative to torch.backends.
_FP32_PRECISION = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _attribute(path: str) -> Any:
    found: Any = torch.backends
    for name in filter(None, path.split(".")):
        found = getattr(found, name, None)
    return found


def _apply(settings: dict[str, Any]) -> None:
    """The parent's settings in this process. Each is set only where it differs: setting one to the value
    it has can still change torch's state (a legacy TF32 flag sets fp32_precision "none" to "ieee")."""

    def put(owner: Any, name: str, value: Any) -> None:
        if getattr(owner, name) != value:
            setattr(owner, name, value)

    flags = settings["flags"]
    if torch.get_float32_matmul_precision() != flags["float32_matmul_precision"]:
        torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    for name, value in flags["cudnn"].items():
        put(torch.backends.cudnn, name, value)
    enabled, warn_only = flags["deterministic"]
    if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != (enabled, warn_only):
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    for name, value in flags["matmul"].items():
        put(torch.backends.cuda.matmul, name, value)
    for name, value in flags["sdp"].items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(value)
    for path, value in flags.get("fp32_precision", {}).items():
        put(_attribute(path), "fp32_precision", value)
    torch_internals.load_compile_config_snapshot(settings["configs"])


@dataclasses.dataclass
class BackgroundCompile:
    """A child process compiling one candidate; :meth:`done` is polled once a training step."""

    process: subprocess.Popen
    payload: str
    log: str
    started: float
    time_limit_s: float = CHILD_TIME_LIMIT_S
    seconds: float | None = None  # the child's own seconds compiling and checking, once it said so (outcome)
    checked: VerificationResult | None = None  # the child's verification of its compile, once it said so (outcome)
    stages: dict[str, float] = dataclasses.field(default_factory=dict)  # the child's seconds by stage (outcome)
    standby: str = ""  # when the interpreter it ran on was started ahead of it (:attr:`Standby.started`); "": fresh
    sent_at: float = dataclasses.field(default_factory=time.time)  # the wall clock when it was given its payload

    def progress(self) -> list[dict[str, Any]]:
        """The stages the child has started so far, in order: each one's name, its wall clock (``at``) and its
        seconds since the child was given its payload (``after_s``). For a report made while it runs: a fit
        that ends first stops it before it says how long each stage took."""
        try:
            with open(self.log) as handle:
                lines = [line for line in handle.read().splitlines() if line.startswith(_STAGE)]
        except OSError:
            return []
        stages = []
        for line in lines:
            with contextlib.suppress(ValueError, KeyError, TypeError):  # a line cut short as the child writes it
                entry = json.loads(line[len(_STAGE):])
                stages.append({"stage": str(entry["stage"]), "at": float(entry["at"]),
                               "after_s": round(float(entry["at"]) - self.sent_at, 3)})
        return stages

    def done(self) -> bool:
        if self.process.poll() is not None:
            return True
        if time.monotonic() - self.started > self.time_limit_s:
            self.stop()
            return True
        return False

    def stop(self) -> None:
        """Ends the child if it still runs (a time limit, a fit that ends) and removes its payload."""
        _end(self.process)
        if os.path.exists(self.payload):
            os.remove(self.payload)

    def discard(self) -> None:
        """Stops the child and removes its files without reading them (the fit ended first)."""
        self.stop()
        if os.path.exists(self.log):
            os.remove(self.log)

    def outcome(self) -> tuple[bool, str]:
        """(whether the child compiled, what it said or why it failed). Call after :meth:`done`."""
        self.stop()
        seconds = time.monotonic() - self.started
        try:
            with open(self.log) as handle:
                text = handle.read()
        finally:
            os.remove(self.log)
        lines = [line for line in text.splitlines() if line.strip()]
        result = next((json.loads(line[len(_RESULT):]) for line in reversed(lines) if line.startswith(_RESULT)), None)
        if self.process.returncode != 0 or result is None:
            if seconds > self.time_limit_s:
                return False, f"the child still compiled after {self.time_limit_s:.0f} s and was stopped"
            last = lines[-1][:300] if lines else "no output"
            return False, f"the child failed (exit code {self.process.returncode}): {last}"
        how = f", at niceness {result['niceness']}" if result.get("niceness") else ""
        how += f"; its interpreter started {self.standby}" if self.standby else ""
        self.seconds = result["seconds"]
        self.stages = result["stages"]
        if result.get("checked"):
            self.checked = VerificationResult(bool(result["passed"]), **result["checked"])
        return True, f"the child compiled and checked it in {result['seconds']:.1f} s ({seconds:.1f} s in all{how})"


def start(
    name: str,
    module: nn.Module,
    held: tuple[tuple[Any, ...], dict[str, Any]],
    options: CompileOptions,
    *,
    standby: Standby | None = None,
    **settings: Any,
) -> BackgroundCompile:
    """Starts a child that compiles ``module`` (the region module called ``name``: "" or "model" for the
    root) on the held input ``held`` as a trial would: on ``standby`` where one waits, else in a fresh
    interpreter. A ``standby`` not used (the module does not pickle, no memory) is stopped. ``settings``:
    the fit's, as :func:`_write_payload` takes them.

    Raises:
        Unavailable: with the reason (the module does not pickle, no memory for the child, ...).
    """
    try:
        payload = _write_payload(name, module, held, options, **settings)
    except Unavailable:
        if standby is not None:
            standby.stop()
        raise
    if standby is not None and standby.go(payload):
        return BackgroundCompile(standby.process, payload, standby.log, time.monotonic(), standby=standby.started)
    if standby is not None:
        standby.stop()  # it died waiting (its log says why): a fresh interpreter instead
    try:
        process, log, _ = _spawn([payload, str(os.getpid()), repr(time.time())])
    except ValueError as error:  # COMPILE_CALLBACK_CHILD_CPUS names CPUs it cannot have
        os.remove(payload)
        raise Unavailable(str(error)) from error
    return BackgroundCompile(process, payload, log, time.monotonic())


def _write_payload(
    name: str,
    module: nn.Module,
    held: tuple[tuple[Any, ...], dict[str, Any]],
    options: CompileOptions,
    *,
    context: Any,
    device: torch.device,
    verify: bool,
    tolerance: float | None,
    needed_bytes: Callable[[], int | None] = lambda: None,
) -> str:
    """The child's payload file (its header, then the module and the held input), where the device has room
    for a second copy of the step; its path. Raises :class:`Unavailable` (no file left behind) otherwise."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        parameters = sum(t.numel() * t.element_size() for t in module.state_dict().values())
        need = (needed_bytes() or 0) + parameters + MEMORY_MARGIN_BYTES
        if free < need:
            raise Unavailable(f"{free / 2**30:.1f} GB of device memory free, the child needs about {need / 2**30:.1f} GB")
    header = {"sys_path": list(sys.path), "settings": _settings(context, device), "options": options,
              "verify": verify, "tolerance": tolerance, "name": name}
    # Modules compiled already (a kept plan tried again with CUDA graphs) are sent as plain modules:
    # the child compiles them as the trial will, and a compiled callable does not pickle.
    compiled = {m: torch_internals.compiled_call(m) for m in module.modules() if torch_internals.compiled_call(m) is not None}
    # Straight into the file (training waits for this): through a buffer first, GPT-2-sized weights took
    # 0.3-0.8 s on a CPU where this takes 0.15-0.19 s, and held twice their size in host memory.
    handle, payload = tempfile.mkstemp(prefix="compile-callback-", suffix=".pkl")
    try:
        with os.fdopen(handle, "wb") as file:
            pickle.dump(header, file)
            for child in compiled:
                torch_internals.restore_compiled_call(child, None)
            # Tensors are copied (CUDA IPC would share them), each plain one as its bytes (_PayloadPickler).
            _PayloadPickler(file).dump((module, held))
    except Exception as error:  # whatever a module holds may refuse: a lambda, a lock, an open file
        os.remove(payload)
        raise Unavailable(f"the module does not pickle ({torch_internals.describe_error(error)[:200]})") from error
    finally:
        for child, call in compiled.items():
            torch_internals.restore_compiled_call(child, call)
    return payload


class _PayloadPickler(pickle.Pickler):
    """Pickles each plain tensor that alone covers its whole storage as that storage's bytes, copied to the
    host once and written straight from there (protocol 5's buffers); the child rebuilds it on the host with
    its dtype, shape, strides (channels_last stays channels_last: Inductor's cache keys hold them),
    ``requires_grad`` and attributes, and moves it to the device as it moves the rest. Torch's own pickling
    of a tensor saves its storage with ``torch.save`` into a buffer first: ResNet-50's weights took the H200's
    host 0.18-0.37 s that way in seven runs, training stopped meanwhile; 0.12 s as bytes (session 25, one
    run). Any other tensor (a view, a subclass, a non-leaf, sparse or quantized) goes the way torch pickles
    it. Either way a tensor pickled twice is one tensor in the child (tied weights stay tied), and two
    tensors on one storage (a view and its base) get a storage each, as torch's pickling gives them."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) not in (torch.Tensor, nn.Parameter) or not _whole_storage(obj):
            return NotImplemented
        flat = obj.detach().as_strided((obj.numel(),), (1,)).cpu().view(torch.uint8)
        state = dict(vars(obj))  # attributes set on a tensor or parameter travel with it, as torch pickles them
        return _rebuild_tensor, (pickle.PickleBuffer(flat.numpy()), str(obj.dtype).removeprefix("torch."),
                                 tuple(obj.shape), obj.stride(), type(obj) is nn.Parameter, obj.requires_grad, state)


def _whole_storage(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a plain leaf on the host or a GPU whose elements fill its storage exactly
    (dense, no overlap, no offset: its bytes are the storage's)."""
    return (tensor.layout == torch.strided and tensor.device.type in ("cpu", "cuda") and tensor.numel() > 0
            and tensor.grad_fn is None and not tensor.is_quantized and not tensor.is_conj() and not tensor.is_neg()
            and tensor.storage_offset() == 0
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


def _rebuild_tensor(data: bytearray, dtype: str, shape: tuple[int, ...], stride: tuple[int, ...], parameter: bool,
                    requires_grad: bool, state: dict[str, Any]) -> torch.Tensor:
    """A tensor :class:`_PayloadPickler` wrote, on the host, over the unpickled bytes."""
    tensor = torch.frombuffer(data, dtype=torch.uint8).view(getattr(torch, dtype)).as_strided(shape, stride)
    rebuilt = nn.Parameter(tensor, requires_grad=requires_grad) if parameter else tensor.requires_grad_(requires_grad)
    vars(rebuilt).update(state)
    return rebuilt


def bytecode_env(env: dict[str, str], *, installed: bool, write: bool) -> dict[str, str]:
    """``env`` for a child that reads (and where ``write``, writes) its imports' bytecode in a folder of its own.

    Where ``env`` says not to write bytecode (``PYTHONDONTWRITEBYTECODE``, common in container images), sets
    aside no folder for it (``PYTHONPYCACHEPREFIX``) and torch came without it (``installed``: torch's own
    ``.pyc``), every child compiles torch's sources again: on the H200's host (``PYTHONDONTWRITEBYTECODE=1``,
    no ``.pyc`` in torch) a standby's imports took 16-23 s from the sources, 29-30 s writing bytecode and
    7.5-10.7 s reading it (2026-12-03). There children read bytecode from :data:`BYTECODE_DIR`, never beside the
    sources, and only a child off the run's critical path writes it (``write``: the standby started while
    another child compiles), so the fit's first child never pays for the writing and a later fit's starts
    from bytecode."""
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX") or installed:
        return env
    env = {name: value for name, value in env.items() if not (write and name == "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPYCACHEPREFIX"] = BYTECODE_DIR
    return env


def bytecode_unwritten() -> bool:
    """Whether children read their imports' bytecode from :data:`BYTECODE_DIR` here (:func:`bytecode_env`)
    and it lacks torch's still: then a child that writes it (:class:`Launcher`) spares later fits' children
    their compiling of the sources."""
    return _lacks_torch_bytecode(bytecode_env(dict(os.environ), installed=_installed_bytecode(), write=False))


def _lacks_torch_bytecode(env: dict[str, str]) -> bool:
    """Whether a child started with ``env`` reads bytecode from :data:`BYTECODE_DIR` and it lacks torch's."""
    return (env.get("PYTHONPYCACHEPREFIX") == BYTECODE_DIR
            and not os.path.exists(boot.cached_in(BYTECODE_DIR, torch.__file__)))


def _installed_bytecode() -> bool:
    """Whether torch came with its bytecode (its ``__init__``'s ``.pyc`` beside it)."""
    return os.path.exists(importlib.util.cache_from_source(torch.__file__))


def _spawn(arguments: list[str], stdin: int = subprocess.DEVNULL, *,
           write_bytecode: bool = False) -> tuple[subprocess.Popen, str, bool]:
    """A fresh interpreter running this module with ``arguments``, its output in a log file of its own
    (``write_bytecode``: see :func:`bytecode_env`), and whether it precompiles. It starts as
    :mod:`compile_callback.boot`, which lowers its priority (:func:`child_niceness`) before it imports anything,
    and where its bytecode folder (:data:`BYTECODE_DIR`) lacks torch's, precompiles: compiles the run's sources
    into it first (in parallel: with a core or two, compiling ahead in one process took longer than the imports
    from the sources, 14.2 s against 11.6 s on a 2-core CPU, so it is not done there)."""
    handle, log = tempfile.mkstemp(prefix="compile-callback-", suffix=".log")
    os.close(handle)
    env = bytecode_env(dict(os.environ), installed=_installed_bytecode(), write=write_bytecode)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the package and the model's modules
    env[boot.LOWER_BY_VARIABLE] = str(child_niceness())  # lowered before its imports, a standby's too
    command = [sys.executable, boot.__file__, *arguments]
    made = [log]  # files this spawn made, removed where it fails
    precompiles = boot.WORKERS > 1 and _lacks_torch_bytecode(env)
    if precompiles:
        sources = boot.sources(list(sys.modules.values()), os.path.dirname(torch.__file__))
        env[boot.PRECOMPILE_VARIABLE] = boot.write_listing(sources)
        made.append(boot.listing_of(env[boot.PRECOMPILE_VARIABLE]))
    try:
        with open(log, "w") as output:
            process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=stdin, env=env)
    except OSError:
        for path in made:
            os.remove(path)
        raise
    cpus = child_cpus()
    if cpus is not None:  # its one thread now: the threads and processes it starts (Inductor's workers) inherit it
        try:
            os.sched_setaffinity(process.pid, cpus)
        except ProcessLookupError:  # it died at once: its log says why
            pass
        except OSError as error:  # none of them is this process's to give (a container's cpuset)
            _end(process)
            raise ValueError(f"{CPUS_VARIABLE}={os.environ[CPUS_VARIABLE]!r}: the child could not be placed on CPUs "
                             f"{sorted(cpus)} ({error}); name CPUs this container may use, or unset it") from error
    return process, log, precompiles


def _end(process: subprocess.Popen) -> None:
    """Kills ``process`` if it still runs and waits for it at most KILL_WAIT_S (see there)."""
    if process.poll() is None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_WAIT_S)


class Standby:
    """An interpreter started at the fit's setup that imports torch, this package and the module the
    LightningModule's class lives in, then waits, idle (no CUDA context, no GPU memory, unless that module's
    import makes one), for a payload:
    the first child skips the interpreter's start and the imports (6-10 s of a child's life on the H200,
    session 17; still 8.3 s after its payload when it was started at the fit's start, 2 s before it,
    session 19), Dynamo's and Inductor's own, and those its unpickling would do. Told to go by :meth:`go`;
    stopped by :meth:`stop` where the search ends without a child (a fit that dies closes its pipe, and a
    waiting standby then exits)."""

    def __init__(self, preload: tuple[str, ...] = (), *, write_bytecode: bool = False,
                 started: str = "with the fit") -> None:
        """``preload``: modules the payload will need (the LightningModule's own), imported while it waits;
        ``write_bytecode``: where none is written, it writes its imports' own (:func:`bytecode_env`);
        ``started``: when it was started, as the report's decision says it."""
        self.preload = tuple(preload)
        self.started = started
        # precompiles: it compiles torch's sources into the children's bytecode folder first (compile_callback.boot)
        self.process, self.log, self.precompiles = _spawn([STANDBY, str(os.getpid()), *preload],
                                                          stdin=subprocess.PIPE, write_bytecode=write_bytecode)

    def go(self, payload: str) -> bool:
        """Hands ``payload`` to the waiting interpreter; False where it is gone (then nothing was sent)."""
        if self.process.poll() is not None or self.process.stdin is None:
            return False
        try:
            self.process.stdin.write(f"{payload} {time.time()!r}\n".encode())
            self.process.stdin.close()
        except OSError:  # it exited between the poll and the write
            return False
        return True

    def stop(self) -> None:
        """Ends the interpreter if it still runs and removes its log (only for a standby never told to go)."""
        _end(self.process)
        if os.path.exists(self.log):
            os.remove(self.log)


class Launcher:
    """Starts the planner's children: ``launcher(name, module, held, options, another=...)`` is :func:`start`
    with the fit's settings, each child on ``standby`` where one was started (rank 0's). Handing one over
    starts the next interpreter, which does its imports while this child compiles, only where it will be
    used or writes what later fits read:

    - ``another``: the search will hand over another child after this one whatever this one's outcome (a
      part prepared before the whole model, payback.part_first_in_background), which a standby spares a
      fresh interpreter's start (14-18 s of imports alone on the H200, session 20);
    - the children's bytecode folder still lacks torch's (:func:`bytecode_unwritten`) and the child handed
      over is not compiling it already (:attr:`Standby.precompiles`): that standby writes it, off the critical
      path, and later fits' children read it. Where the child precompiles, a second writer would compile the
      same sources into the same folder at once: on a fresh H100 host the two pools (18 processes) made the
      steps beside them 1.154x slower than with them stopped, against 0.983x once the bytecode was written
      (session 43, ``benchmarks`` variant ``callback_pause_ab``).

    Otherwise a next child, if the search comes to one (this one failed or was not kept), starts fresh. The
    usual search hands over one child (ResNet-18 CIFAR, ResNet-50: the whole model, kept): a second
    interpreter importing beside the first, and beside training, through the run's first seconds served
    nothing. One never used is stopped by :meth:`close`."""

    def __init__(self, *, standby: Standby | None, **settings: Any) -> None:
        self.settings = settings
        self.standby = standby

    def __call__(self, name: str, module: nn.Module, held: Any, options: CompileOptions, *,
                 another: bool = False) -> BackgroundCompile:
        waiting, self.standby = self.standby, None
        child = start(name, module, held, options, standby=waiting, **self.settings)
        # Not after a standby that died waiting (its log says why), nor to write bytecode the child is writing.
        if waiting is not None and child.standby and (
                another or (bytecode_unwritten() and not waiting.precompiles)):
            self.standby = Standby(waiting.preload, write_bytecode=True,  # its imports wait on no one
                                   started="as the child before it was handed over")
        return child

    def close(self) -> None:
        """The search is over (or the fit): a standby never used is stopped. Safe to call twice."""
        if self.standby is not None:
            self.standby.stop()
            self.standby = None


def _watch_parent(parent: int) -> None:
    """Ends this child when the run that started it is gone (killed, crashed) or past the time limit:
    a compile nobody will read must not go on holding a GPU and CPUs."""
    import threading

    started = time.monotonic()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent or time.monotonic() - started > CHILD_TIME_LIMIT_S:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _child(path: str, parent: int, spawned: float) -> int:
    """The child: load, compile as a trial does, run the verification's runs, say how it went, with its
    seconds by stage (``spawned``: the parent's wall clock when it started the process, or sent a standby
    its payload: the start-up the run waited for, near nothing where the standby was ready)."""
    from compile_callback import verify
    from compile_callback.planner import warm_call
    from compile_callback.profile import _copy
    from compile_callback.verify import run_forward_and_backward, timed_stage, twin_options, verify_module

    def stage_started(stage: str) -> None:  # the run reads these when the fit ends first (BackgroundCompile.progress)
        print(_STAGE + json.dumps({"stage": stage, "at": time.time()}), flush=True)

    stages = {"start-up (interpreter and imports)": time.time() - spawned}
    verify.stage_started = stage_started
    stage_started("loading (unpickling, to the device)")
    precompiled = json.loads(os.environ.get(boot.PRECOMPILED_VARIABLE) or "null")  # compile_callback.boot's
    if precompiled:  # at the interpreter's start: for a standby, before its payload came, in part or in all
        stages[f"start-up: bytecode of {precompiled['compiled']} sources compiled first, in {precompiled['workers']} "
               f"processes"] = precompiled["seconds"]

    _watch_parent(parent)
    started = time.monotonic()
    with open(path, "rb") as file:
        header = pickle.load(file)
        niceness = None
        with contextlib.suppress(AttributeError, OSError):  # lowered at its start (compile_callback.boot); none on Windows
            niceness = os.nice(0)
        for entry in reversed(header["sys_path"]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        settings = header["settings"]
        _apply(settings)
        module, (args, kwargs) = pickle.load(file)
    device = torch.device(settings["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    module.to(device)
    args, kwargs = _copy((args, kwargs), device)
    stages["loading (unpickling, to the device)"] = time.monotonic() - started
    autocast = settings["autocast"]
    default_dtype = getattr(torch, settings.get("default_dtype", "float32"))

    @contextlib.contextmanager
    def context() -> Iterator[None]:  # the training step's forward as the parent's precision sets it
        with contextlib.ExitStack() as stack:
            for device_type, dtype in autocast.items():
                stack.enter_context(torch.autocast(device_type, dtype=getattr(torch, dtype)))
            stack.callback(torch.set_default_dtype, torch.get_default_dtype())
            torch.set_default_dtype(default_dtype)
            yield

    compile_region(Region(name=header["name"] or "model", module_names=[header["name"]], modules=[module]), header["options"])
    if header["verify"]:
        result = verify_module(module, args, kwargs, context=context, tolerance=header["tolerance"],
                               options=header["options"])
        if result.passed and twin_options(result.random, header["options"]) is not None:
            # Verified on a twin (random numbers drawn): the graph the run trains on is the module's own; warm it too,
            # forward and backward (the backward compiles at its first call). Best effort: the run
            # compiles it at its next step either way.
            try:
                with timed_stage(stages, "the training graph (verified on a twin)", device), context():
                    run_forward_and_backward(module, args, kwargs)
            except Exception as error:
                print(f"the training graph was not warmed: {type(error).__name__}: {error}", flush=True)
    else:
        stage_started("compiled (not verified)")
        result = warm_call(module, args, kwargs, context=context)
    if result.error is not None and result.where == "compile":
        print(f"compile failed: {result.error}", flush=True)
        return 1
    checked = {"max_rel_error": result.max_rel_error, "tolerance": result.tolerance, "where": result.where,
               "error": result.error, "random": result.random} if header["verify"] else None
    print(_RESULT + json.dumps({"seconds": time.monotonic() - started, "passed": result.passed, "niceness": niceness,
                                "checked": checked, "stages": {**stages, **result.seconds}}), flush=True)
    return 0


def _standby(parent: int, preload: list[str]) -> int:
    """A :class:`Standby`: the imports a child's work needs (``preload``: the modules its payload's classes
    come from), then a wait for its payload on stdin (the payload's path and the parent's wall clock when it
    sent it); none (the pipe closed): nothing to do."""
    import importlib

    import torch._dynamo  # noqa: F401  (Dynamo's and Inductor's imports: seconds of a child's first compile)
    import torch._inductor.compile_fx  # noqa: F401

    from compile_callback import planner, profile, verify  # noqa: F401  (what _child imports)

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception as error:  # the unpickling will say it plainly if it matters; the wait goes on
            print(f"preloading {name} failed: {type(error).__name__}: {error}", flush=True)

    request = sys.stdin.readline().split()
    if not request:
        return 0
    payload, sent = request
    return _child(payload, parent, float(sent))


if __name__ == "__main__":
    code = _standby(int(sys.argv[2]), sys.argv[3:]) if sys.argv[1] == STANDBY else _child(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
    # Out without the interpreter's teardown (the CUDA context, Inductor's compile workers, every module's
    # objects), which the run waits through before it reads the result: the caches were written as each
    # compile finished, and the result line is flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
