"""vLLM's Mamba2 Triton kernels, loaded with the least of vLLM they need, and the launch
metadata vLLM's serving path gives them.

The kernel checks compare four of vLLM's kernels with the reference: the chunked SSD
(``mamba_chunk_scan_combined_varlen``), the decode state update (``selective_state_update``)
and the causal convolution (``causal_conv1d_fn`` for prefill, ``causal_conv1d_update`` for
decode).

Two ways to reach them (:func:`load`):

1. **vLLM's package**, on CUDA, when it imports and its platform is CUDA: the modules as vLLM
   serves with them.
2. **vLLM's kernel files alone**: the ``mamba/ops`` folder of an installed vLLM, or of a copy
   that travelled to a GPU machine without vLLM (``VLLM_KERNELS_SOURCE``), executed under a
   private package name with small stand-ins for the seven vLLM modules they import
   (:data:`STAND_INS`). The import lines are the only text changed and each keeps its line, so
   Triton reads the kernels' source from the original files. A CPU-only vLLM cannot serve the
   first route: its ops modules swap the Triton functions for CPU ones at import.

On the CPU the kernel files are executed with ``TRITON_INTERPRET=1`` (set only while Triton
decorates them; nothing else in the process changes): Triton's interpreter runs each program
with NumPy, slowly but as written, so CPU runs check vLLM's kernel code at small shapes. Four gaps
of the interpreter are bridged, in Triton, not in vLLM's code: autotuning (every config is timed
equal, so the first left after vLLM's own pruning runs); kernel arguments that a grid callback
replaces (converted as a GPU launch reads them); Triton's own library functions, compiled ones
when Triton was imported before the interpreter was asked for (interpreted copies during each
launch); and ``tl.dot`` on bf16, which the interpreter computes on the values' bits (widened to
fp32 first, as tensor cores multiply).

Only the standard library is imported at module level: finding the kernel files must not pick
vLLM's platform or import torch.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import re
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The kernel files, in ``vllm/model_executor/layers/mamba/ops``, in import order.
KERNEL_FILES = (
    "triton_helpers.py",
    "mamba_ssm.py",
    "ssd_bmm.py",
    "ssd_chunk_state.py",
    "ssd_state_passing.py",
    "ssd_chunk_scan.py",
    "ssd_combined.py",
    "causal_conv1d.py",
)
#: Beside the kernel files, what the files route reads: the tuned decode configs and the file
#: that defines the slot constants (read, never imported).
KERNEL_DATA = ("configs", "../../../../v1/attention/backends/utils.py")
#: The vLLM modules the kernel files import, and what stands in for each on the files route.
STAND_INS = {
    "vllm.envs": "VLLM_TUNED_CONFIG_FOLDER = None (vLLM's bundled tuned configs only)",
    "vllm.logger": "init_logger: a logging.Logger with info_once / warning_once",
    "vllm._custom_ops": "an empty module (only Mamba1's selective_scan_fn uses it)",
    "vllm.platforms": "current_platform: CUDA as torch sees it, never CPU or XPU; PDL from sm90",
    "vllm.triton_utils": "HAS_TRITON, triton, tl: the installed Triton; as vLLM's, "
    "VLLM_TRITON_FORCE_FIRST_CONFIG=1 skips autotuning (each kernel's first config)",
    "vllm.utils.platform_utils": "get_device_name_as_file_name from torch.cuda",
    "vllm.v1.attention.backends.utils": "NULL_BLOCK_ID, PAD_SLOT_ID read from vLLM's own file",
}
_OPS = "model_executor.layers.mamba.ops"
_MODULES = {"ssd_combined": "ssd_combined", "mamba_ssm": "mamba_ssm", "conv": "causal_conv1d"}
_IMPORT_LINE = re.compile(r"^(\s*)(from|import)\s+vllm(?=[.\s])")


class KernelLoadError(RuntimeError):
    """vLLM's kernels could not be reached; the message says why for each route."""


@dataclass(frozen=True)
class Kernels:
    """The four kernels, the slot constants they use, and how they were reached."""

    mamba_chunk_scan_combined_varlen: Callable[..., Any]
    selective_state_update: Callable[..., Any]
    causal_conv1d_fn: Callable[..., Any]
    causal_conv1d_update: Callable[..., Any]
    #: The state-cache slot a batch entry names to be skipped (vLLM's ``NULL_BLOCK_ID``).
    null_block_id: int
    #: The padding value of vLLM's per-token slot tables (``PAD_SLOT_ID``).
    pad_slot_id: int
    #: ``"vllm package"`` or ``"vllm kernel files"``.
    route: str
    #: The folder the kernel files were read from.
    source: Path
    #: ``"cuda"`` or ``"triton interpreter"``.
    runs_on: str
    #: Why the package route was not taken (empty when it was).
    package_refused: str = ""
    #: What stood in for the rest of vLLM (empty on the package route).
    stand_ins: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        lines = [f"vLLM's Mamba kernels: {self.route} from {self.source}, on {self.runs_on}"]
        if self.package_refused:
            lines.append(f"  vLLM's package was not used: {self.package_refused}")
        lines += [f"  stand-in {name}: {what}" for name, what in self.stand_ins.items()]
        return "\n".join(lines)


def installed_ops_folder() -> Path | None:
    """``vllm/model_executor/layers/mamba/ops`` of the installed vLLM, found without importing
    vLLM (its import picks a platform)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    ops = Path(next(iter(spec.submodule_search_locations))).joinpath(*_OPS.split("."))
    return ops if ops.is_dir() else None


def _package_modules() -> tuple[dict[str, Any] | None, str]:
    """vLLM's own modules when they hold the Triton kernels; else None and why not."""
    try:
        from vllm.platforms import current_platform
    except Exception as error:  # any failure to import is a reason to take the other route
        return None, f"import vllm.platforms failed: {type(error).__name__}: {error}"
    if not current_platform.is_cuda():
        platform = type(current_platform).__name__
        why = " (its ops modules swap in CPU implementations)" if current_platform.is_cpu() else ""
        return None, f"vLLM's platform is {platform}, not CUDA{why}"
    try:
        modules = {
            key: importlib.import_module(f"vllm.{_OPS}.{name}") for key, name in _MODULES.items()
        }
    except Exception as error:
        return None, f"importing vLLM's Mamba ops failed: {type(error).__name__}: {error}"
    return modules, ""


def slot_constants(ops: Path) -> dict[str, int]:
    """``NULL_BLOCK_ID`` and ``PAD_SLOT_ID`` as vLLM's ``v1/attention/backends/utils.py``
    assigns them, read without running the file."""
    path = (ops / KERNEL_DATA[1]).resolve()
    names = ("NULL_BLOCK_ID", "PAD_SLOT_ID")
    found: dict[str, int] = {}
    if path.is_file():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in names:
                    found[target.id] = int(ast.literal_eval(node.value))
    missing = sorted(set(names) - set(found))
    if missing:
        raise KernelLoadError(f"{path}: expected module-level assignments of {missing}")
    return found


class _Platform:
    """What the kernel files ask of vLLM's ``current_platform``."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda
        self._has_cuda = bool(torch.cuda.is_available())

    def is_cpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return self._has_cuda

    def _capability(self) -> tuple[int, int]:
        if not self._has_cuda:
            return (0, 0)
        major, minor = self._cuda.get_device_capability()
        return int(major), int(minor)

    def is_device_capability(self, capability: int) -> bool:
        major, minor = self._capability()
        return major * 10 + minor == capability

    def is_arch_support_pdl(self) -> bool:
        # As vLLM's CUDA platform: programmatic dependent launch from compute capability 9.
        return self._capability()[0] >= 9

    def get_device_name(self, device_id: int = 0) -> str:
        return str(self._cuda.get_device_name(device_id)) if self._has_cuda else "cpu"


class _OnceLogger(logging.LoggerAdapter[logging.Logger]):
    def info_once(self, msg: str, *args: Any, **_: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **_: Any) -> None:
        self.warning(msg, *args)


def _triton(name: str) -> Any:
    """A module of Triton (untyped: imported by name)."""
    return importlib.import_module(name)


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _stand_ins(package: str, ops: Path, constants: dict[str, int]) -> None:
    """The private package's tree of stand-ins, each as :data:`STAND_INS` describes."""
    triton, tl = _triton("triton"), _triton("triton.language")
    platform = _Platform()
    for sub in ("", ".utils", ".v1", ".v1.attention", ".v1.attention.backends"):
        _module(package + sub, __path__=[])
    _module(f"{package}.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    _module(f"{package}.logger", init_logger=lambda name: _OnceLogger(logging.getLogger(name)))
    _module(f"{package}._custom_ops")
    _module(f"{package}.platforms", current_platform=platform)
    _module(f"{package}.triton_utils", HAS_TRITON=True, triton=triton, tl=tl)
    _module(
        f"{package}.utils.platform_utils",
        get_device_name_as_file_name=lambda device_id=0: re.sub(
            r"[\s/]+", "_", platform.get_device_name(device_id)
        ),
    )
    _module(f"{package}.v1.attention.backends.utils", **constants)
    parts = _OPS.split(".")
    for depth in range(1, len(parts)):
        _module(f"{package}.{'.'.join(parts[:depth])}", __path__=[])
    _module(f"{package}.{_OPS}", __path__=[str(ops)])


def _execute(path: Path, name: str, package: str) -> types.ModuleType:
    """Run one kernel file as module ``name``, its ``vllm`` imports pointed at ``package``
    (line for line: Triton reads each kernel's source from ``path``)."""
    lines = path.read_text().split("\n")
    text = "\n".join(_IMPORT_LINE.sub(rf"\1\2 {package}", line) for line in lines)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    module.__package__ = name.rpartition(".")[0]
    sys.modules[name] = module
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


#: The bridges already installed in Triton (each wraps a Triton method once per process).
_BRIDGED: set[str] = set()


def _installed_before(bridge: str) -> bool:
    """Whether ``bridge`` is installed already; if not, it is recorded as installed (the caller
    installs it now)."""
    if bridge in _BRIDGED:
        return True
    _BRIDGED.add(bridge)
    return False


def _untimed_autotuning() -> None:
    """Triton's autotuner times configs with a GPU driver, which the interpreter lacks: every
    config is timed equal, so the first that vLLM's pruning leaves is used."""
    Autotuner = _triton("triton.runtime.autotuner").Autotuner

    def untimed(self: Any, *args: Any, config: Any, **meta: Any) -> list[float]:
        return [0.0, 0.0, 0.0]

    Autotuner._bench = untimed


def _grid_arguments_converted() -> None:
    """vLLM's convolution launch puts its program table into the kernel's arguments from the
    grid callback; a GPU launch reads arguments after the callback, the interpreter converts
    them before it. Convert what the callback put."""
    import torch

    interpreter = _triton("triton.runtime.interpreter")
    if _installed_before("grid arguments"):
        return
    original = interpreter.GridExecutor.__init__

    def init(self: Any, fn: Any, arg_names: Any, grid: Any, *rest: Any, **named: Any) -> None:
        if callable(grid):
            callback = grid

            def grid(args: dict[str, Any]) -> Any:
                shape = callback(args)
                for name, value in args.items():
                    if isinstance(value, torch.Tensor):
                        args[name] = interpreter._implicit_cvt(value)
                return shape

        original(self, fn, arg_names, grid, *rest, **named)

    interpreter.GridExecutor.__init__ = init


def _bf16_dot_widened() -> None:
    """The interpreter keeps bf16 values as their uint16 bits and multiplies those bits in
    ``tl.dot`` (Triton 3.8). Widen bf16 operands to fp32 first: exact, and what a GPU's tensor
    cores compute (bf16 products are exact in fp32; the sum accumulates in fp32)."""
    import numpy as np

    tl, interpreter = _triton("triton.language"), _triton("triton.runtime.interpreter")

    if _installed_before("bf16 dot"):
        return
    original = interpreter.InterpreterBuilder.create_dot

    def widened(handle: Any) -> Any:
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        data = interpreter._convert_float(handle.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(self: Any, a: Any, b: Any, *rest: Any, **named: Any) -> Any:
        return original(self, widened(a), widened(b), *rest, **named)

    interpreter.InterpreterBuilder.create_dot = create_dot


def _library_interpreted_during_launches() -> None:
    """Triton's own library functions (``tl.cumsum``, ``tl.sum``, ...) were decorated for
    compilation when Triton was imported before ``TRITON_INTERPRET`` was set; during an
    interpreted launch, interpreted copies stand in for them (restored after the launch)."""
    tl, standard = _triton("triton.language"), _triton("triton.language.standard")
    interpreter = _triton("triton.runtime.interpreter")
    JITFunction = _triton("triton.runtime.jit").JITFunction

    if _installed_before("library"):
        return
    original = interpreter.GridExecutor.__call__
    # Imported lazily by launches, and it asserts on the library's decoration: import it first.
    with contextlib.suppress(ImportError):
        importlib.import_module("triton.experimental.gluon.language")
    copies: list[tuple[Any, str, Any]] = []
    for name, value in vars(standard).items():
        if isinstance(value, JITFunction):
            copy = interpreter.InterpretedFunction(value.fn)
            copies += [(module, name, copy) for module in (tl, standard) if name in vars(module)]
    if not copies:
        return  # Triton was imported interpreting: its library is interpreted already

    def call(self: Any, *args: Any, **named: Any) -> Any:
        saved = [(owner, name, getattr(owner, name)) for owner, name, _ in copies]
        for owner, name, copy in copies:
            setattr(owner, name, copy)
        try:
            return original(self, *args, **named)
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)

    interpreter.GridExecutor.__call__ = call


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _file_modules(ops: Path, interpret: bool) -> tuple[dict[str, Any], dict[str, int]]:
    missing = [name for name in KERNEL_FILES if not (ops / name).is_file()]
    if missing:
        raise KernelLoadError(f"{ops}: expected vLLM's kernel files, missing {missing}")
    constants = slot_constants(ops)
    # One private package per folder and mode: a mutated copy never shares modules.
    digest = hashlib.sha1(str(ops.resolve()).encode()).hexdigest()[:10]
    package = f"_vllm_mamba_kernels_{'interpreted' if interpret else 'compiled'}_{digest}"
    if interpret or os.environ.get("VLLM_TRITON_FORCE_FIRST_CONFIG", "0") not in ("", "0"):
        _untimed_autotuning()
    if interpret:
        _grid_arguments_converted()
        _library_interpreted_during_launches()
        _bf16_dot_widened()
    loaded: dict[str, Any] = {}
    with _environment("TRITON_INTERPRET", "1" if interpret else None):
        _stand_ins(package, ops, constants)
        for file in KERNEL_FILES:
            stem = file.removesuffix(".py")
            name = f"{package}.{_OPS}.{stem}"
            loaded[stem] = sys.modules.get(name) or _execute(ops / file, name, package)
    return {key: loaded[stem] for key, stem in _MODULES.items()}, constants


def load_files(ops: Path, interpret: bool, package_refused: str = "") -> Kernels:
    """The kernels from the kernel files in ``ops`` (the files route), not cached: a test can
    load a mutated copy beside the real one."""
    modules, constants = _file_modules(ops, interpret)
    return _kernels(modules, constants, "vllm kernel files", ops, interpret, package_refused)


def _kernels(
    modules: dict[str, Any],
    constants: dict[str, int],
    route: str,
    source: Path,
    interpret: bool,
    package_refused: str,
) -> Kernels:
    return Kernels(
        mamba_chunk_scan_combined_varlen=modules["ssd_combined"].mamba_chunk_scan_combined_varlen,
        selective_state_update=modules["mamba_ssm"].selective_state_update,
        causal_conv1d_fn=modules["conv"].causal_conv1d_fn,
        causal_conv1d_update=modules["conv"].causal_conv1d_update,
        null_block_id=constants["NULL_BLOCK_ID"],
        pad_slot_id=constants["PAD_SLOT_ID"],
        route=route,
        source=source,
        runs_on="triton interpreter" if interpret else "cuda",
        package_refused=package_refused,
        stand_ins={} if route == "vllm package" else dict(STAND_INS),
    )


_LOADED: dict[bool, Kernels] = {}


def load(interpret: bool) -> Kernels:
    """vLLM's kernels by the first route that serves (module docstring), loaded once per mode.

    ``interpret``: run them in Triton's interpreter (CPU tensors) rather than compiled (CUDA).
    The files route reads ``$VLLM_KERNELS_SOURCE`` when set, else the installed vLLM's folder.
    """
    if interpret in _LOADED:
        return _LOADED[interpret]
    if not interpret:
        import torch

        if not torch.cuda.is_available():
            raise KernelLoadError(
                "compiled kernels need a CUDA device: torch.cuda.is_available() is False "
                "(Triton's interpreter runs them on the CPU)"
            )
    modules, refused = (None, "Triton's interpreter runs kernel files, never vLLM's CPU build")
    if not interpret:
        modules, refused = _package_modules()
    if modules is not None:
        source = Path(modules["ssd_combined"].__file__).parent
        kernels = _kernels(modules, slot_constants(source), "vllm package", source, False, "")
    else:
        configured = os.environ.get("VLLM_KERNELS_SOURCE")
        if configured and not Path(configured).is_dir():
            raise KernelLoadError(
                "VLLM_KERNELS_SOURCE: expected the folder vllm/model_executor/layers/mamba/ops "
                f"of a copy of vLLM's sources, got {configured!r} (not a folder)"
            )
        ops = Path(configured) if configured else installed_ops_folder()
        if ops is None:
            raise KernelLoadError(
                f"vLLM's package was not used ({refused}) and no kernel files were found: "
                "install vllm, or set VLLM_KERNELS_SOURCE to vllm/model_executor/layers/mamba/"
                "ops inside a copy of vLLM's sources (nemotron-vl-gpu-bundle makes one)"
            )
        kernels = load_files(ops, interpret, refused)
    _LOADED[interpret] = kernels
    return kernels


@dataclass(frozen=True)
class ChunkLayout:
    """A prefill batch cut into SSD chunks as vLLM's Mamba2 metadata builder cuts it: every
    chunk holds one sequence's tokens, and chunk ends fall on multiples of the chunk size in
    each sequence's absolute positions (a sequence resumed after ``computed`` tokens starts
    with a short chunk)."""

    cu_seqlens: list[int]
    cu_chunk_seqlens: list[int]
    seq_idx: list[int]
    last_chunk_indices: list[int]


def chunk_layout(chunk_size: int, lengths: Sequence[int], computed: Sequence[int]) -> ChunkLayout:
    """``lengths[i]`` new tokens of sequence ``i``, which has ``computed[i]`` before them."""
    cu_seqlens, cu_chunks, seq_idx, last = [0], [], [], []
    position = 0
    for sequence, (length, done) in enumerate(zip(lengths, computed, strict=True)):
        end = position + length
        boundary = done + chunk_size - done % chunk_size  # the next absolute chunk end
        while position < end:
            step = min(boundary - done, end - position)
            cu_chunks.append(position)
            seq_idx.append(sequence)
            position, done, boundary = position + step, done + step, boundary + chunk_size
        last.append(len(cu_chunks) - 1)
        cu_seqlens.append(end)
    cu_chunks.append(position)
    return ChunkLayout(cu_seqlens, cu_chunks, seq_idx, last)


#: The prefill convolution's token block; vLLM's metadata builder tabulates only this one.
CONV_BLOCK_M = 8


def conv_programs(query_start_loc: Any, pad_slot_id: int) -> types.SimpleNamespace:
    """The convolution's program table as vLLM's metadata builder makes it (its
    ``nums_dict`` / ``batch_ptr`` / ``token_chunk_offset_ptr``): program ``k`` handles block
    ``token_chunk_offset_ptr[k]`` of ``CONV_BLOCK_M`` tokens of sequence ``batch_ptr[k]``."""
    import torch

    lengths = query_start_loc.cpu().diff()
    blocks = (lengths + CONV_BLOCK_M - 1) // CONV_BLOCK_M
    sequence_of = torch.repeat_interleave(torch.arange(len(blocks)), blocks).to(torch.int32)
    block_of = torch.cat([torch.arange(int(n)) for n in blocks]).to(torch.int32)
    count = len(sequence_of)
    device = query_start_loc.device
    batch_ptr = torch.full((count + 1,), pad_slot_id, dtype=torch.int32)
    offsets = torch.full((count + 1,), pad_slot_id, dtype=torch.int32)
    batch_ptr[:count], offsets[:count] = sequence_of, block_of
    batch_ptr, offsets = batch_ptr.to(device), offsets.to(device)
    table = {
        "nums": blocks,
        "tot": count,
        "mlist": sequence_of,
        "mlist_len": count,
        "offsetlist": block_of,
        "batch_ptr": batch_ptr,
        "token_chunk_offset_ptr": offsets,
    }
    return types.SimpleNamespace(
        nums_dict={CONV_BLOCK_M: table}, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets
    )


def main(argv: list[str] | None = None) -> int:
    """``nemotron-vl-gpu-kernels [--interpret] [--out route.json]``: load the kernels as
    the checks will, say by which route and why, and write that as JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="nemotron-vl-gpu-kernels", description=main.__doc__)
    parser.add_argument("--interpret", action="store_true", help="Triton's interpreter (CPU)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        kernels = load(args.interpret)
    except Exception as error:  # reported, not raised: the caller records why
        record: dict[str, object] = {"loaded": False, "error": f"{type(error).__name__}: {error}"}
        print(f"vLLM's kernels could not be loaded: {record['error']}", file=sys.stderr)
    else:
        print(kernels.describe())
        record = {
            "loaded": True,
            "route": kernels.route,
            "source": str(kernels.source),
            "runs_on": kernels.runs_on,
            "package_refused": kernels.package_refused,
            "stand_ins": kernels.stand_ins,
        }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0 if record["loaded"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
