"""The config-field inventory: every config field and processor option the model's vLLM code
reads during the suites, measured, with the check that fails if vLLM ignored it.

    nemotron-vl-config-fields [--out reports] [--parallel N] [--only SECTION.FIELD ...]

1. **Recorded, not listed.** The conformance suites run once against the installed vLLM with
   ``--record-config-reads`` (:mod:`harness.plugin.config_reads`): every read of a field of the
   checkpoint's config objects (top level, ``text_config``, ``vision_config`` and its ``args``,
   ``sound_config``) or of an option given to the processor, by one of the model family's files,
   is kept with the lines that read it and the checks it ran for (a model build's reads count for
   every check that used the build). The same run records each variant the suites built, with its
   ``config.json``.
2. **The values.** For each field: its value in the published checkpoints (Nemotron Nano 12B v2 VL
   and Nemotron 3 Nano Omni, as ``reference_impl.presets`` writes them from the architecture
   brief), in the default tiny variant, and the variants that set another value.
3. **Ignored.** A field that some variant sets to another value is ignored in a run of the checks
   that read it, whole modules of them (``--ignore-config-field``: every read sees the default
   variant's value, as if vLLM hard-coded it): the checks that fail there, and passed in the
   recording run, are the ones that catch vLLM ignoring it.

The report (``config-fields.md`` and ``.json``) has one row per field with its verdict:
``caught`` (a check fails when it is ignored), ``not caught`` (a variant sets it, and no check
fails), ``no variant`` (every variant the suites build holds the default's value, or none),
``no variant, explained`` (no variant sets it, for the reason ``fixtures/config_fields.toml``
gives: one of :data:`REASONS`), ``no effect, explained`` (a variant sets it, no check fails
when it is ignored, and the file says why nothing vLLM computes from it reaches a request:
:data:`INERT`), ``variant needs CUDA`` (only variants a CPU vLLM cannot build set
it),
``a section`` (the attribute that holds a sub-config), ``bookkeeping`` (what every transformers
config holds, read when vLLM copies a whole config) or ``derived`` (an object vLLM built from
the checkpoint's, not a field of the checkpoint). An entry of ``fixtures/config_fields.toml``
for a field that some variant now sets, or that nothing reads, is listed as stale.

    nemotron-vl-config-fields --explain-only

re-reads ``config-fields.json`` and applies the reasons again, without a run (for an edit of the
reasons alone).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.checkpoints.spec import ModelSpec
from harness.jobs.results import replace_text
from harness.mutation.runner import SuiteJob, SuiteRun, preload, run_many, run_one
from harness.plugin.config_reads import checkpoint_config, section_values
from harness.toml_tables import string_tables

SUITES = ("suites/conformance",)
REPORT_STEM = "config-fields"
#: What a run that ignores a field may take (the slowest module selection: about 2 minutes).
IGNORE_RUN_TIMEOUT_S = 600.0
#: Attributes that hold a sub-config (or the checkpoint's bookkeeping), not a value a request sees.
SECTION_ATTRIBUTES = frozenset({"text_config", "vision_config", "sound_config", "args"})
ABSENT = "(absent)"
#: Outcomes that count as a check failing when a field is ignored.
FAILED = frozenset({"fail", "error", "xpass"})
#: Outcomes a check may have had in the recording run for its failure to count: a pass, or a
#: known deviation whose cause held (the strict xfail fails, naming both causes, when ignoring
#: the field changes what happens).
HELD = frozenset({"pass", "xfail"})
PUBLISHED_NAMES = ("Nemotron Nano 12B v2 VL", "Nemotron 3 Nano Omni")
REASONS_FILE = ROOT / "fixtures" / "config_fields.toml"
#: Why no variant sets a field the model's vLLM code reads, and what that means.
REASONS = {
    "forward": "read only by the language model's forward pass (or its MoE router), which vLLM "
    "runs only on CUDA: no CPU check sees a value it changes",
    "absent": "in neither published checkpoint nor ours: every read sees its default",
    "name": "set by RADIO's model name, which fixes the vision tower's sizes (the tiny variants "
    "use the smallest name)",
    "fixed": "one value serves this model in vLLM 0.33.0: vLLM's own code passes it, or "
    "another value fails before any request",
    "direct": "a serving option a named check sets itself and judges directly",
    "option": "a value no variant builds yet, though a checkpoint could set it: a candidate "
    "variant, named with why it is not built",
    "inert": "read, and set by variants, but nothing vLLM computes from it reaches a request: "
    "no check failed while it was ignored, and the code path says why",
}
#: The one reason for a field some variant sets (every other reason says why none does).
INERT = "inert"


class ReasonsFileError(ValueError):
    """``fixtures/config_fields.toml`` is malformed; the message names the entry and the key."""


@dataclass(frozen=True)
class FieldReason:
    """Why no variant sets ``name`` (``SECTION.FIELD``), or why ignoring it changes nothing
    (:data:`INERT`)."""

    name: str
    reason: str
    why: str


def load_reasons(path: Path = REASONS_FILE) -> dict[str, FieldReason]:
    """The entries of ``path`` by field; every malformed one raises :class:`ReasonsFileError`."""
    if not path.is_file():
        return {}
    reasons: dict[str, FieldReason] = {}
    keys = frozenset({"name", "reason", "why"})
    for where, entry in string_tables(path, "field", keys, ReasonsFileError):
        if "." not in entry["name"]:
            raise ReasonsFileError(
                f"{where}: name: expected 'SECTION.FIELD', got {entry['name']!r}"
            )
        if entry["reason"] not in REASONS:
            raise ReasonsFileError(
                f"{where}: reason: expected one of {sorted(REASONS)}, got {entry['reason']!r}"
            )
        if entry["name"] in reasons:
            raise ReasonsFileError(f"{where}: name: {entry['name']!r} has an entry already")
        reasons[entry["name"]] = FieldReason(entry["name"], entry["reason"], entry["why"].strip())
    return reasons


class InventoryError(ValueError):
    """The recording run left nothing to build the inventory from."""


def published_configs() -> dict[str, dict[str, Any]]:
    """``config.json`` of each published checkpoint as the presets write it."""
    from reference_impl import presets
    from reference_impl.checkpoint import vl_config_to_hf_dict

    return {
        PUBLISHED_NAMES[0]: vl_config_to_hf_dict(presets.nemotron_nano_12b_v2_vl()),
        PUBLISHED_NAMES[1]: vl_config_to_hf_dict(presets.nemotron_3_nano_omni()),
    }


def value_in(config: Mapping[str, Any], section: str, name: str) -> Any:
    """The value of ``section.name`` in a ``config.json`` content; :data:`ABSENT` if it has
    none. A processor option has none (its values are the ones recorded)."""
    return section_values(config, section).get(name, ABSENT)


@dataclass
class FieldRow:
    """One field the model's vLLM code reads, and what protects it."""

    section: str
    field: str
    sites: list[str]
    checks: list[str]  # the checks that read it
    published: dict[str, Any]
    default: Any
    values_seen: list[str]  # a processor option's values as given
    variants: list[str]  # the variants (slugs) that set another value than the default's
    # the checks run while it was ignored, and those of them that failed
    ignored_checks: list[str] = dataclasses.field(default_factory=list)
    #: whether some check that reads it ran (not skipped) on a variant of ``variants`` (none:
    #: the checks that read it there need CUDA, as the Omni language model's MoE layers do)
    served: bool = True
    caught_by: list[str] = dataclasses.field(default_factory=list)
    run_problem: str = ""
    #: why no variant sets it (REASONS), and in words, from fixtures/config_fields.toml
    reason: str = ""
    why: str = ""

    @property
    def name(self) -> str:
        return f"{self.section}.{self.field}"

    @property
    def verdict(self) -> str:
        if self.section.startswith("derived "):
            return "derived"
        if self.field in SECTION_ATTRIBUTES and self.section != "vision_config.args":
            return "a section"
        if self.field in bookkeeping_fields():
            return "bookkeeping"
        if not self.variants:
            return "no variant, explained" if self.reason else "no variant"
        if self.run_problem:
            return "not run"
        if self.caught_by:
            return "caught"
        if self.reason == INERT and self.ignored_checks:
            return "no effect, explained"
        return "not caught" if self.served else "variant needs CUDA"

    @property
    def to_ignore(self) -> bool:
        """Whether an ignore run can tell something: a field of the checkpoint that some variant
        sets, not run yet."""
        return self.verdict in ("not caught", "variant needs CUDA") and not self.ignored_checks


@functools.cache
def bookkeeping_fields() -> frozenset[str]:
    """What every transformers config holds (its name, labels, output switches, version), read
    when vLLM copies a whole config (``to_dict``): no model field; ``dtype`` excepted, which
    sets the dtype a tower computes in."""
    from transformers import PretrainedConfig

    return frozenset(PretrainedConfig().to_dict()) - {"dtype"}


def build_rows(
    recorded: Mapping[str, Any],
    published: Mapping[str, Mapping[str, Any]],
    ran: Collection[str] | None = None,
) -> list[FieldRow]:
    """One row per recorded field, with its published, default and variant values; ``ran``: the
    checks that ran and were not skipped in the recording run (None: all), so that a field read
    on its variants only by skipping checks (those needing CUDA) is told apart."""
    variants = recorded.get("variants") or []
    if not recorded.get("fields"):
        raise InventoryError("the recording run recorded no config reads (was vLLM the target?)")
    default = next((v for v in variants if v["slug"] == ModelSpec().slug), None)
    default_config = default["config"] if default else _default_config()
    served_by = {v["slug"]: set(v.get("checks", [])) for v in variants}
    ran = set(ran) if ran is not None else None
    rows = []
    for entry in recorded["fields"]:
        section, name = entry["section"], entry["field"]
        default_value = value_in(default_config, section, name)
        if section == "processor option":
            others = [v for v in entry.get("values", []) if v not in ("None", "False")]
            differing = sorted(set(others)) if len(set(entry.get("values", []))) > 1 else []
        else:
            # A variant sets another value; one without the field (no sound_config) does not.
            differing = sorted(
                v["slug"]
                for v in variants
                if value_in(v["config"], section, name) not in (default_value, ABSENT)
            )
        rows.append(
            FieldRow(
                section=section,
                field=name,
                sites=list(entry["sites"]),
                checks=list(entry["checks"]),
                published={k: value_in(c, section, name) for k, c in published.items()},
                default=default_value,
                values_seen=list(entry.get("values", [])),
                variants=differing,
                served=section == "processor option"
                or ran is None
                or any(served_by.get(v, set()) & ran & set(entry["checks"]) for v in differing),
            )
        )
    return rows


def _default_config() -> dict[str, Any]:
    return checkpoint_config(ModelSpec())


def modules_of(checks: Sequence[str]) -> list[str]:
    """The modules (``suites/...py``) holding ``checks``: an ignore run runs whole modules, whose
    checks share the models and processors the reads happened in."""
    return sorted({c.split("::", 1)[0] for c in checks if "::" in c})


def record(workdir: Path, suites: Sequence[str] = SUITES) -> tuple[dict[str, Any], SuiteRun]:
    """The recording run: the suites against vLLM with every config read recorded."""
    out = workdir / "config-reads.json"
    job = SuiteJob(
        "record",
        "vllm",
        tuple(suites),
        workdir / "record",
        extra_args=(f"--record-config-reads={out}",),
    )
    run = run_one(job)
    if run.results is None or not out.exists():
        raise InventoryError(
            f"the recording run wrote no results (exit {run.returncode}):\n{run.output[-3000:]}"
        )
    document: dict[str, Any] = json.loads(out.read_text())
    return document, run


def ignore_runs(rows: Sequence[FieldRow], baseline: SuiteRun, workdir: Path, parallel: int) -> None:
    """Run each row that some variant sets with the field ignored; fill its ``caught_by``."""
    held = {c["id"] for c in baseline.checks if c["outcome"] in HELD}
    jobs = []
    by_key = {}
    for index, row in enumerate(rows):
        if not row.to_ignore:
            continue
        modules = modules_of([c for c in row.checks if c.startswith("suites/")])
        if not modules:
            row.run_problem = "no check of the suites read it"
            continue
        key = f"ignore-{index}"
        by_key[key] = row
        jobs.append(
            SuiteJob(
                key,
                "vllm",
                tuple(modules),
                workdir / key,
                extra_args=(f"--ignore-config-field={row.name}",),
                timeout_s=IGNORE_RUN_TIMEOUT_S,
            )
        )
    for run in run_many(jobs, parallel=parallel):
        row = by_key[run.key]
        if run.results is None or not run.checks:
            row.run_problem = f"the run ran no checks (exit {run.returncode})"
            continue
        row.ignored_checks = sorted(c["id"] for c in run.checks)
        row.caught_by = sorted(
            c["id"] for c in run.checks if c["outcome"] in FAILED and c["id"] in held
        )
        print(f"  {row.name}: {len(row.caught_by)} of {len(run.checks)} checks fail", flush=True)


def explain(rows: Sequence[FieldRow], reasons: Mapping[str, FieldReason]) -> list[str]:
    """Give each row no variant sets its entry's reason, and each row a variant sets that no
    check caught its :data:`INERT` entry; return the stale entries: those for a field nothing
    read, for one some variant now sets (an entry other than :data:`INERT`), and an
    :data:`INERT` one for a field no variant sets or some check catches."""
    for row in rows:
        row.reason = row.why = ""
    by_name = {row.name: row for row in rows}
    stale = []
    for name, entry in sorted(reasons.items()):
        explained = by_name.get(name)
        if explained is None:
            why = "no longer read"
        elif entry.reason == INERT and not explained.variants:
            why = "inert, but no variant sets it"
        elif entry.reason == INERT and explained.caught_by:
            why = f"inert, but {len(explained.caught_by)} check(s) fail when it is ignored"
        elif entry.reason != INERT and explained.variants:
            why = f"set by {len(explained.variants)} variant(s)"
        else:
            explained.reason, explained.why = entry.reason, entry.why
            continue
        stale.append(f"{name}: {why}")
    return stale


def build_report(
    rows: Sequence[FieldRow], meta: Mapping[str, Any], stale: Sequence[str] = ()
) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.verdict] = counts.get(row.verdict, 0) + 1
    return {
        "meta": dict(meta),
        "verdicts": counts,
        "stale_reasons": list(stale),
        "fields": [asdict(row) | {"verdict": row.verdict} for row in rows],
    }


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return "`" + text.replace("|", "\\|") + "`"


VERDICT_ORDER = (
    "not caught",
    "no variant",
    "variant needs CUDA",
    "no variant, explained",
    "no effect, explained",
    "not run",
    "caught",
    "a section",
    "bookkeeping",
    "derived",
)


def render_markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        "# Config fields the model's vLLM code reads",
        "",
        "Generated by `nemotron-vl-config-fields` (`harness/mutation/config_fields.py`): every "
        "field of the checkpoint's config and every processor option that vLLM's model-family "
        "files read while the conformance suites ran against the installed vLLM "
        f"({meta.get('vllm', '?')}), recorded on the real config objects. A field some variant "
        "sets to another value was then ignored (every read saw the default variant's value) "
        "in a run of the modules whose checks read it; the checks that failed there catch vLLM "
        "ignoring it.",
        "",
        f"Recording run: {meta.get('record_wall_s')} s; ignore runs: {meta.get('ignore_runs')} "
        f"in {meta.get('ignore_wall_s')} s; variants built: {meta.get('variants')}.",
        "",
        "| verdict | fields |",
        "|---|---|",
        *(f"| {v} | {report['verdicts'][v]} |" for v in VERDICT_ORDER if v in report["verdicts"]),
        "",
        "| field | read at | "
        + " | ".join(PUBLISHED_NAMES)
        + " | tiny default | variants with another value | checks that fail when ignored"
        + " | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    stale = report.get("stale_reasons", [])
    if stale:
        lines[lines.index("| verdict | fields |") - 1 : lines.index("| verdict | fields |") - 1] = [
            "",
            "**Stale entries of `fixtures/config_fields.toml`** (remove them):",
            "",
            *(f"- {s}" for s in stale),
        ]
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    for row in sorted(
        report["fields"], key=lambda r: (order[r["verdict"]], r["section"], r["field"])
    ):
        sites = ", ".join(f"`{s.split('/')[-1]}`" for s in row["sites"][:3]) + (
            f" (+{len(row['sites']) - 3})" if len(row["sites"]) > 3 else ""
        )
        published = " | ".join(_cell(row["published"].get(n, ABSENT)) for n in PUBLISHED_NAMES)
        default = (
            _cell(row["default"])
            if row["section"] != "processor option"
            else _cell(", ".join(row["values_seen"]))
        )
        variants = ", ".join(f"`{v}`" for v in sorted(row["variants"], key=len)[:2]) + (
            f" (+{len(row['variants']) - 2})" if len(row["variants"]) > 2 else ""
        )
        if row.get("reason"):
            caught = f"{row['reason']}: {row['why']}" + (
                f" (0 of {len(row['ignored_checks'])} failed)" if row["ignored_checks"] else ""
            )
        elif row["ignored_checks"]:
            caught = f"{len(row['caught_by'])} of {len(row['ignored_checks'])}: " + ", ".join(
                f"`{c.split('::')[-1]}`" for c in row["caught_by"][:2]
            )
        else:
            caught = row["run_problem"]
        lines.append(
            f"| `{row['section']}.{row['field']}` | {sites} | {published} | {default} | "
            f"{variants} | {caught} | {row['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def inventory(out: Path, *, parallel: int, only: Sequence[str] = ()) -> dict[str, Any]:
    """Record, build the rows, ignore each field a variant sets, write the report."""
    import vllm

    preload(vllm=True)
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-config-fields-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        recorded, baseline = record(workdir)
        record_wall = round(time.perf_counter() - started, 1)
        ran = {c["id"] for c in baseline.checks if c["outcome"] != "skip"}
        rows = build_rows(recorded, published_configs(), ran)
        stale = explain(rows, load_reasons())
        if only:
            unknown = sorted(set(only) - {r.name for r in rows})
            if unknown:
                raise InventoryError(f"--only: fields never read: {unknown}")
            for row in rows:
                if row.name not in only and row.to_ignore:
                    row.run_problem = "not selected (--only)"
        started = time.perf_counter()
        ignore_runs(rows, baseline, workdir, parallel)
        ignore_wall = round(time.perf_counter() - started, 1)
    report = build_report(
        rows,
        {
            "command": "nemotron-vl-config-fields",
            "vllm": vllm.__version__,
            "record_wall_s": record_wall,
            "ignore_wall_s": ignore_wall,
            "ignore_runs": sum(1 for r in rows if r.ignored_checks),
            "variants": len(recorded.get("variants", [])),
            "checks": len(recorded.get("checks", [])),
        },
        stale,
    )
    write_report(out, report)
    return report


def write_report(out: Path, report: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    replace_text(out / f"{REPORT_STEM}.json", json.dumps(report, indent=1) + "\n")
    replace_text(out / f"{REPORT_STEM}.md", render_markdown(report))


def explain_again(out: Path, reasons: Mapping[str, FieldReason]) -> dict[str, Any]:
    """The committed report with the reasons applied again (no run)."""
    path = out / f"{REPORT_STEM}.json"
    if not path.is_file():
        raise InventoryError(f"--explain-only: no report at {path} (run the inventory first)")
    document = json.loads(path.read_text())
    names = {f.name for f in dataclasses.fields(FieldRow)}
    rows = [FieldRow(**{k: v for k, v in row.items() if k in names}) for row in document["fields"]]
    stale = explain(rows, reasons)
    report = build_report(rows, document["meta"], stale)
    write_report(out, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-config-fields", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "reports", help="report folder")
    parser.add_argument("--parallel", type=int, default=2, help="ignore runs at a time")
    parser.add_argument(
        "--only", nargs="*", default=(), metavar="SECTION.FIELD", help="ignore only these fields"
    )
    parser.add_argument(
        "--explain-only",
        action="store_true",
        help="apply fixtures/config_fields.toml to the report in --out again, without a run",
    )
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel: expected a positive number, got {args.parallel}")
    try:
        if args.explain_only:
            report = explain_again(args.out, load_reasons())
        else:
            report = inventory(args.out, parallel=args.parallel, only=args.only)
    except (InventoryError, ReasonsFileError) as e:
        print(f"nemotron-vl-config-fields: {e}", file=sys.stderr)
        return 2
    print(f"config fields: {report['verdicts']} -> {args.out / REPORT_STEM}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
