"""What a GPU run carries: vLLM's sources for a machine without vLLM.

``nemotron-vl-gpu-bundle [--out .gpu-bundle] [--kernels-only]`` writes, from the installed
vLLM:

- ``vllm-kernels/vllm/...``: the Mamba kernel files, vLLM's tuned decode configs and the file
  that defines the slot constants, in vLLM's own layout (the kernel checks' files route,
  ``VLLM_KERNELS_SOURCE``; about 0.4 MB);
- ``vllm-src.tar.gz``: vLLM's whole Python package without its compiled extensions and caches
  (about 40 MB), so the GPU run can find out whether vLLM's package imports there (the package
  route); left out with ``--kernels-only``;
- ``bundle.json``: vLLM's version and each part's size.

``scripts/gpu_checks.sh`` reads the folder (``GPU_BUNDLE``); the device tool carries it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from importlib import metadata
from pathlib import Path

from harness.gpu.kernels import KERNEL_DATA, KERNEL_FILES, installed_ops_folder

#: What the device tool carries at most, with the repository (64 MiB).
CARRY_LIMIT_BYTES = 64 * 2**20
#: Where ``mamba/ops`` sits inside vLLM's package.
OPS_IN_PACKAGE = Path("model_executor/layers/mamba/ops")


class BundleError(RuntimeError):
    """The bundle cannot be made; the message says what is missing."""


def copy_kernel_files(destination: Path, ops: Path | None = None) -> Path:
    """Copy vLLM's kernel files (and what the files route reads beside them) from ``ops``
    (default: the installed vLLM's) to ``destination/vllm/...``; returns the copy's ``ops``."""
    ops = ops or installed_ops_folder()
    if ops is None:
        raise BundleError("no installed vLLM to copy the kernel files from (pip install vllm)")
    target = destination / "vllm" / OPS_IN_PACKAGE
    target.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_FILES:
        shutil.copy2(ops / name, target / name)
    configs, constants = KERNEL_DATA
    shutil.copytree(ops / configs, target / configs, dirs_exist_ok=True)
    (target / constants).resolve().parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2((ops / constants).resolve(), (target / constants).resolve())
    return target


def _without_compiled(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = info.name
    if name.endswith((".so", ".pyc")) or "/__pycache__" in name:
        return None
    return info


def make(out: Path, with_package: bool = True) -> dict[str, object]:
    """Write the bundle to ``out`` (replacing what was there); returns ``bundle.json``."""
    ops = installed_ops_folder()
    if ops is None:
        raise BundleError("no installed vLLM to bundle (pip install vllm)")
    if out.exists():
        shutil.rmtree(out)
    kernels = copy_kernel_files(out / "vllm-kernels", ops)
    sizes = {"vllm-kernels": sum(f.stat().st_size for f in kernels.rglob("*") if f.is_file())}
    if with_package:
        package = ops.parents[len(OPS_IN_PACKAGE.parts) - 1]
        archive = out / "vllm-src.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(package, arcname="vllm", filter=_without_compiled)
        sizes["vllm-src.tar.gz"] = archive.stat().st_size
    manifest: dict[str, object] = {
        "vllm_version": metadata.version("vllm"),
        "sizes_bytes": sizes,
        "total_bytes": sum(sizes.values()),
        "carry_limit_bytes": CARRY_LIMIT_BYTES,
    }
    (out / "bundle.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-gpu-bundle", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(".gpu-bundle"))
    parser.add_argument(
        "--kernels-only", action="store_true", help="leave out vLLM's whole package (40 MB)"
    )
    args = parser.parse_args(argv)
    try:
        manifest = make(args.out, with_package=not args.kernels_only)
    except BundleError as error:
        print(f"harness.gpu.bundle: {error}", file=sys.stderr)
        return 2
    print(json.dumps(manifest, indent=2))
    total = manifest["total_bytes"]
    assert isinstance(total, int)
    if total > CARRY_LIMIT_BYTES:
        print(
            f"harness.gpu.bundle: {total} bytes is over the {CARRY_LIMIT_BYTES}-byte carry "
            "limit: use --kernels-only",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
