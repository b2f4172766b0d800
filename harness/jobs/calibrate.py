"""``nemotron-vl-calibrate``: measure each parity path's error, derive its bounds, check them.

For each parity path (:data:`harness.inputs.drawn.DRAWN_PATHS`, and the connector), each
served-dtype case (:data:`harness.checkpoints.serving.DTYPE_CASES`) and each weight seed, a
checkpoint folder is drawn from the seed (:func:`harness.checkpoints.writer.write_checkpoint`),
built by the target under test (vLLM by default) and by the reference (fp32), and requests drawn
per path are run through both; each item's rows are measured as the parity checks measure them
(:func:`harness.oracles.rows.measure_items`). The samples go into a table
(:data:`harness.oracles.bounds.CALIBRATION_TABLE` with ``--write``) from which
:mod:`harness.oracles.bounds` derives the bounds. A cell the target cannot serve (it raises, or
its rows come in another dtype than the one served: pinned deviations of the installed vLLM)
gets no samples, and the reason is written instead: its checks keep the analytic ceiling.

``--check-seeds A-B`` then runs the request catalogue's parity forms and the connector on weights
drawn from seeds the calibration never saw, judged by the derived bounds exactly as the checks
judge them, and reports each path's largest error against its bound and every failure: the
proof that the bounds do not fail an honest target. ``--check-only`` judges the committed table
so, without calibrating.

Each folder is written into a temporary folder removed after its seed: thousands of folders are
drawn, and kept they would fill a disk.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import ROOT
from harness.checkpoints.serving import DEFAULT_SERVING, DTYPE_CASES, ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import REQUEST_FORMS
from harness.inputs.drawn import CONNECTOR_GRID, DRAWN_PATHS, connector_features
from harness.oracles.bounds import (
    CALIBRATION_TABLE,
    SHAPES_DIR,
    STATISTICS,
    CalibrationTable,
    Statistic,
    cell_key,
    committed_table,
    dtype_name,
    error_statistics,
    parse_table,
    shape_slug,
    tower_shape,
    with_tower_shape,
)
from harness.oracles.rows import EMBEDDING_TABLE, ItemErrors, judge, measure_items
from harness.targets import resolve_target
from harness.targets.base import MultimodalModel, Target, TargetLoadError, TargetUnavailable
from harness.targets.reference.target import ReferenceTarget

CPU = torch.device("cpu")
#: Weight seeds the calibration draws by default; the suites' folders use seed 0, and
#: ``--check-seeds`` defaults to :data:`CHECK_SEEDS`, so the three never overlap.
CALIBRATION_SEEDS = range(1, 13)
CHECK_SEEDS = range(100, 120)
#: Where :func:`check_bounds` lists the forms it does not judge (the target's pinned
#: deviations): not a bound's failure.
NOT_SERVED = "(not served)"
#: Requests drawn per path and weight seed.
DRAWS_PER_SEED = 2


def _seeds(text: str) -> range:
    """``A-B`` (inclusive) or ``A``."""
    try:
        first, _, last = text.partition("-")
        seeds = range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds as A-B or A, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected A <= B in {text!r}")
    return seeds


@contextlib.contextmanager
def drawn_folder(spec: ModelSpec, seed: int) -> Iterator[Path]:
    """``spec``'s checkpoint folder with weights drawn from ``seed``, removed at the end."""
    from harness.checkpoints.writer import write_checkpoint

    root = Path(tempfile.mkdtemp(prefix="nemotron-vl-calibrate-"))
    try:
        yield write_checkpoint(spec, root / spec.slug, seed=seed)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Models:
    """The target's and the reference's models of one drawn folder."""

    target: MultimodalModel
    reference: MultimodalModel
    embedding_table: torch.Tensor
    served: torch.dtype


@dataclass
class Reference:
    """The reference's model of one drawn folder (fp32), and the folder's token embeddings."""

    model: MultimodalModel
    embedding_table: torch.Tensor

    @classmethod
    def of(cls, spec: ModelSpec, folder: Path) -> Reference:
        from reference_impl.checkpoint import read_weights

        model, _ = ReferenceTarget().build_model(spec, folder, CPU, DEFAULT_SERVING)
        return cls(model, read_weights(folder)[EMBEDDING_TABLE])


def _built(
    target: Target, spec: ModelSpec, folder: Path, serving: ServingConfig, reference: Reference
) -> Models:
    model, _ = target.build_model(spec, folder, CPU, serving)
    served = serving.torch_dtype() or model.input_dtype
    return Models(model, reference.model, reference.embedding_table, served)


def _reason(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}"


@dataclass
class Samples:
    """What a calibration measured."""

    cells: dict[str, dict[Statistic, list[float]]] = field(default_factory=dict)
    not_calibrated: dict[str, str] = field(default_factory=dict)

    def add(self, key: str, errors: dict[Statistic, float]) -> None:
        cell = self.cells.setdefault(key, {s: [] for s in STATISTICS})
        for statistic in STATISTICS:
            cell[statistic].append(float(f"{errors[statistic]:.5g}"))


def calibrate(
    target: Target,
    seeds: range,
    draws: int,
    paths: list[str],
    log: bool = True,
    shape: dict[str, object] | None = None,
) -> Samples:
    """Samples of every path in ``paths`` (and ``connector``) in every served-dtype case, over
    weights drawn from ``seeds`` and ``draws`` requests per seed. Each folder is drawn, and the
    reference built on it, once per seed and saved dtype; a case the target cannot build, or
    whose cells it failed already, is not tried again. With a tower ``shape``
    (:func:`~harness.oracles.bounds.tower_shape`), every folder has it, and only bf16 served
    from bf16 is measured."""
    samples = Samples()
    dtype_cases = [DTYPE_CASES[0]] if shape else list(DTYPE_CASES)
    unbuildable: set[tuple[ModelSpec, ServingConfig]] = set()
    specs: dict[ModelSpec, list[str]] = {}
    for path in paths:
        spec = ModelSpec() if path == "connector" else DRAWN_PATHS[path].spec
        specs.setdefault(spec, []).append(path)
    for seed in seeds:
        start = time.perf_counter()
        for base, spec_paths in specs.items():
            for saved in dict.fromkeys(saved for saved, _ in dtype_cases):
                spec = dataclasses.replace(base, checkpoint_dtype=saved)
                spec = with_tower_shape(spec, shape) if shape else spec
                cases = [
                    serving
                    for case_saved, serving in dtype_cases
                    if case_saved == saved
                    and (spec, serving) not in unbuildable
                    and not all(
                        cell_key(path, served, saved) in samples.not_calibrated
                        for path in spec_paths
                        for served in _served_names(serving, saved)
                    )
                ]
                if not cases:
                    continue
                with drawn_folder(spec, seed) as folder:
                    reference = Reference.of(spec, folder)
                    for serving in cases:
                        target.forget_models()
                        try:
                            models = _built(target, spec, folder, serving, reference)
                        except Exception as exc:
                            unbuildable.add((spec, serving))
                            why = f"{target.name} cannot build it: {_reason(exc)}"
                            for path in spec_paths:
                                for served in _served_names(serving, saved):
                                    samples.not_calibrated[cell_key(path, served, saved)] = why
                            continue
                        for path in spec_paths:
                            _sample_path(
                                samples, path, spec, seed, draws, models, saved, target.name
                            )
        if log:
            print(
                f"seed {seed}: {time.perf_counter() - start:.1f} s, "
                f"{sum(len(c['global']) for c in samples.cells.values())} samples",
                file=sys.stderr,
            )
    for key in samples.cells:
        samples.not_calibrated.pop(key, None)
    return samples


def covering_array_shapes() -> list[dict[str, object]]:
    """The tower shapes of the covering array's variants other than the default one, in the
    order the array lists them."""
    from harness.checkpoints.pairs import covering_array

    default = tower_shape(ModelSpec())
    shapes: list[dict[str, object]] = []
    for spec in covering_array():
        shape = tower_shape(spec)
        if shape != default and shape not in shapes:
            shapes.append(shape)
    return shapes


def _served_names(serving: ServingConfig, saved: str) -> list[str]:
    """The dtypes ``serving`` may serve a folder saved in ``saved`` in: its ``--dtype``, or for
    ``auto`` (the engine's choice, known only once built) bf16 or the saved dtype."""
    dtype = serving.torch_dtype()
    return [dtype_name(dtype)] if dtype is not None else ["bfloat16", saved]


def _sample_path(
    samples: Samples,
    path: str,
    spec: ModelSpec,
    seed: int,
    draws: int,
    models: Models,
    saved: str,
    selector: str,
) -> None:
    key = cell_key(path, dtype_name(models.served), saved)
    if key in samples.not_calibrated:
        return
    for draw in range(draws):
        request_seed = seed * 1000 + draw
        try:
            if path == "connector":
                features = connector_features(request_seed)
                got = models.target.connect(features, CONNECTOR_GRID)
                want = models.reference.connect(features, CONNECTOR_GRID)
                if got.dtype != models.served:
                    raise AssertionError(
                        f"connector rows came in {got.dtype}, not the served {models.served}"
                    )
                samples.add(key, error_statistics(got, want))
                continue
            request = DRAWN_PATHS[path].request(spec, request_seed)
            towers, _ = measure_items(
                models.target.run_request(request),
                models.reference.run_request(request),
                request,
                spec,
                served=models.served,
                embedding_table=models.embedding_table,
            )
        except Exception as exc:
            samples.not_calibrated[key] = f"{selector} fails the path: {_reason(exc)}"
            samples.cells.pop(key, None)
            return
        for item in towers:
            if item.name.startswith(DRAWN_PATHS[path].modality):
                samples.add(key, item.errors)


def _harness_version() -> str:
    from importlib import metadata

    try:
        version = metadata.version("nemotron-vl-conformance")
    except metadata.PackageNotFoundError:
        version = "not installed"
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return f"{version} (git {commit})"


def table_json(
    samples: Samples,
    target: Target,
    seeds: range,
    draws: int,
    shape: dict[str, object] | None = None,
) -> dict[str, object]:
    identity = target.identity()
    shaped = {"shape": shape} if shape else {}
    return {
        "about": {
            "what": "relative errors of the target's tower rows against the fp32 reference, "
            "per parity path, served dtype and saved dtype (harness.oracles.bounds)",
            "command": f"nemotron-vl-calibrate --target {target.name} --seeds "
            f"{seeds.start}-{seeds.stop - 1} --draws {draws} --write"
            + (" --shapes" if shape else ""),
            "target": target.name,
            "vllm": f"{identity.name} {identity.version}",
            "harness": _harness_version(),
            "torch": torch.__version__,
            "written": datetime.date.today().isoformat(),
            "weight_seeds": [seeds.start, seeds.stop - 1],
            "draws_per_seed": draws,
            **shaped,
        },
        "cells": dict(sorted(samples.cells.items())),
        "not_calibrated": dict(sorted(samples.not_calibrated.items())),
    }


# ---------------------------------------------------------------------------------------------
# Checking the bounds on seeds the calibration never saw


@dataclass
class PathCheck:
    """One path's comparisons on the check seeds: the largest error over bound per statistic."""

    comparisons: int = 0
    worst: dict[Statistic, tuple[float, float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, item: ItemErrors, seed: int, form: str) -> None:
        assert item.bounds is not None
        self.comparisons += 1
        for statistic in STATISTICS:
            error, bound = item.errors[statistic], item.bounds[statistic].value
            if statistic not in self.worst or error / bound > self.worst[statistic][0] / max(
                self.worst[statistic][1], 1e-30
            ):
                self.worst[statistic] = (error, bound)
        self.failures += [f"seed {seed} {form}: {p}" for p in item.problems]


def check_bounds(
    target: Target, seeds: range, table: CalibrationTable | None = None
) -> dict[str, PathCheck]:
    """The catalogue's parity forms served as the parity checks serve them, and the connector,
    on weights drawn from each of ``seeds``, judged by ``table`` (the committed one by
    default): per path, the largest error over its bound and every failure."""
    checks: dict[str, PathCheck] = {}
    pinned = _pinned_parity_forms(target)
    if pinned:
        checks[NOT_SERVED] = PathCheck(
            failures=[f"{form}: not judged, a pinned deviation: {why}" for form, why in pinned]
        )
    skipped = {form for form, _ in pinned}
    forms = [
        f for f in REQUEST_FORMS if not _given_embeddings_only(f.name) and f.name not in skipped
    ]
    specs: dict[ModelSpec, list[str]] = {ModelSpec(): ["connector"]}
    for form in forms:
        specs.setdefault(form.spec, []).append(form.name)
    for seed in seeds:
        for spec, names in specs.items():
            with drawn_folder(spec, seed) as folder:
                target.forget_models()
                reference = Reference.of(spec, folder)
                models = _built(target, spec, folder, DEFAULT_SERVING, reference)
                for name in names:
                    _check_form(checks, name, spec, seed, models, table)
    return checks


#: The parity check of a request form, by form.
PARITY_CHECK = "suites/conformance/test_parity.py::test_request_matches_the_reference[{}]"


def _pinned_parity_forms(target: Target) -> list[tuple[str, str]]:
    """The forms whose parity check is a known deviation of ``target`` (its deviation file),
    with the reason: their rows are wrong for a pinned cause, not by rounding."""
    from harness.jobs.deviations import deviations_path, load_deviations

    if not target.deviations_name:
        return []
    pinned = load_deviations(deviations_path(target.deviations_name))
    return [
        (form.name, pinned[check].reason[:160])
        for form in REQUEST_FORMS
        if (check := PARITY_CHECK.format(form.name)) in pinned
    ]


def _given_embeddings_only(form: str) -> bool:
    return "embeds" in form


def _check_form(
    checks: dict[str, PathCheck],
    form: str,
    spec: ModelSpec,
    seed: int,
    models: Models,
    table: CalibrationTable | None,
) -> None:
    if form == "connector":
        features = connector_features(51)
        got = models.target.connect(features, CONNECTOR_GRID)
        want = models.reference.connect(features, CONNECTOR_GRID)
        errors = error_statistics(got, want)
        item = judge(ItemErrors("connector", "connector", got.dtype, errors, 0), "bfloat16", table)
        checks.setdefault("connector", PathCheck()).add(item, seed, form)
        return
    request = next(f.request for f in REQUEST_FORMS if f.name == form)
    try:
        actual = models.target.run_request(request)
    except Exception as exc:  # a pinned deviation of the request path, not a bound's failure
        checks.setdefault(NOT_SERVED, PathCheck()).failures.append(
            f"seed {seed} {form}: {_reason(exc)}"
        )
        return
    towers, _ = measure_items(
        actual,
        models.reference.run_request(request),
        request,
        spec,
        embedding_table=models.embedding_table,
    )
    for item in towers:
        judge(item, spec.checkpoint_dtype, table)
        checks.setdefault(item.path, PathCheck()).add(item, seed, form)


# ---------------------------------------------------------------------------------------------
# The command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="vllm", help="the implementation measured")
    parser.add_argument(
        "--seeds",
        type=_seeds,
        default=CALIBRATION_SEEDS,
        help="weight seeds to calibrate on, A-B (default %(default)s)",
    )
    parser.add_argument("--draws", type=int, default=DRAWS_PER_SEED, help="requests per seed")
    parser.add_argument(
        "--paths", nargs="*", default=[*DRAWN_PATHS, "connector"], help="the paths to calibrate"
    )
    parser.add_argument(
        "--shapes",
        action="store_true",
        help=f"calibrate each of the covering array's other tower shapes (bf16): {SHAPES_DIR}",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write {CALIBRATION_TABLE} (with --shapes, one file per shape in {SHAPES_DIR})",
    )
    parser.add_argument("--report", type=Path, help="write the bounds (and checks) as Markdown")
    parser.add_argument("--out", type=Path, help="write the table here instead")
    parser.add_argument(
        "--check-seeds",
        type=_seeds,
        help="then judge the catalogue on these weight seeds by the new bounds (e.g. 100-119)",
    )
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="calibrate nothing: judge the committed table on --check-seeds",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.paths) - {*DRAWN_PATHS, "connector"})
    if unknown:
        parser.error(f"--paths: expected among {[*DRAWN_PATHS, 'connector']}, got {unknown}")
    if args.draws < 1:
        parser.error(f"--draws: expected at least 1, got {args.draws}")
    if args.check_only and (args.check_seeds is None or args.write or args.out):
        parser.error("--check-only: expected --check-seeds, and neither --write nor --out")
    try:
        target = resolve_target(args.target)
        target.load()
    except (TargetLoadError, TargetUnavailable) as e:
        print(f"nemotron-vl-calibrate: error: {e}", file=sys.stderr)
        return 2
    if args.check_only:
        table = committed_table()
    else:
        if args.shapes:
            if args.out is not None or args.check_seeds is not None:
                parser.error("--shapes: expected neither --out nor --check-seeds")
            return calibrate_shapes(target, args.seeds, args.draws, list(args.paths), args)
        samples = calibrate(target, args.seeds, args.draws, list(args.paths))
        data = table_json(samples, target, args.seeds, args.draws)
        table = parse_table(data, "the new calibration")
        out = CALIBRATION_TABLE if args.write else args.out
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote {out}", file=sys.stderr)
    report = [f"# Parity bounds of {target.name}", "", bounds_markdown(table)]
    failed = False
    if args.check_seeds is not None:
        checks = check_bounds(target, args.check_seeds, table)
        report += ["", check_markdown(checks, args.check_seeds)]
        failed = any(c.failures for p, c in checks.items() if p != NOT_SERVED)
    text = "\n".join(report) + "\n"
    if args.report is not None:
        args.report.write_text(text)
    print(text)
    return 1 if failed else 0


def calibrate_shapes(
    target: Target, seeds: range, draws: int, paths: list[str], args: argparse.Namespace
) -> int:
    """Each of the covering array's other tower shapes calibrated on its own, its table written
    (``--write``) to :data:`SHAPES_DIR`, every shape's bounds reported."""
    report = [f"# Parity bounds of {target.name} per tower shape"]
    for shape in covering_array_shapes():
        samples = calibrate(target, seeds, draws, paths, shape=shape)
        data = table_json(samples, target, seeds, draws, shape)
        table = parse_table(data, f"the calibration of {shape_slug(shape)}")
        if args.write:
            out = SHAPES_DIR / f"{shape_slug(shape)}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote {out}", file=sys.stderr)
        report += ["", f"## {shape_slug(shape)}", "", bounds_markdown(table)]
    text = "\n".join(report) + "\n"
    if args.report is not None:
        args.report.write_text(text)
    print(text)
    return 0


def bounds_markdown(table: CalibrationTable) -> str:
    """Each calibrated cell's bounds, and the cells left at the ceiling with the reason."""
    lines = [
        "| cell | samples | global | row | channel | largest global sample |",
        "|---|---|---|---|---|---|",
    ]
    for key in table.samples:
        path, served, saved = key.split(" | ")
        bounds = table.bounds(
            path, getattr(torch, served.removeprefix("served-")), saved.removeprefix("saved-")
        )
        g = bounds["global"]
        lines.append(
            f"| {key} | {g.samples} | {g.value:.3g} | {bounds['row'].value:.3g} | "
            f"{bounds['channel'].value:.3g} | {g.largest_sample:.3g} |"
        )
    lines += ["", "Left at the analytic ceiling:", ""]
    lines += [f"- {key}: {why}" for key, why in table.not_calibrated.items()]
    return "\n".join(lines)


def check_markdown(checks: dict[str, PathCheck], seeds: range) -> str:
    lines = [
        f"Bounds judged on weight seeds {seeds.start}-{seeds.stop - 1}:",
        "",
        "| path | comparisons | worst global (error / bound) | worst row | worst channel "
        "| failures |",
        "|---|---|---|---|---|---|",
    ]
    for path, check in sorted(checks.items()):
        if path == NOT_SERVED:
            continue
        worst = [f"{e:.3g} / {b:.3g}" for e, b in (check.worst[s] for s in STATISTICS)]
        lines.append(
            f"| {path} | {check.comparisons} | {' | '.join(worst)} | {len(check.failures)} |"
        )
    for _, check in sorted(checks.items()):
        lines += [f"- {failure}" for failure in check.failures]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
