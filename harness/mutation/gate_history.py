"""The gate on the model's upstream history: each fix the regression corpus records, both ways.

    nemotron-vl-gate-history [--out DIR] [--fix PR ...] [--whole-suites] [--no-engine]
                             [--keep-warm [MINUTES]]

An *episode* is one upstream pull request of the corpus (``fixtures/corpus.toml``) that fixed
bugs in vLLM's files. A vLLM checkout made here (``<out>/<PR>/vllm-checkout``) holds two
commits: ``before PR``, the files with every bug the pull request fixed put back (the corpus's
``vllm-file`` mutants of its records, applied together to the installed files: the upstream
files before the fix cannot be fetched here, the fixed ones are the installed release's), and
``PR``, the files as the installed release ships them. The gate (``nemotron-vl-gate``) runs on
both directions:

- **the fix** (base ``before PR``, head ``PR``): expected exit 0, and every check the corpus pins
  as failing on one of the bugs among the fixes (fail → pass, or → a known deviation's xfail);
- **the bug** (base ``PR``, head ``before PR``: the change that brought the bugs in, as a revert
  of the fix): expected exit 1, its regressions exactly the checks the corpus pins (each failing
  with its pinned reason), the known deviations the bugs happen to fix (the corpus's ``xpass``)
  among the fixed deviations.

The expectations are the corpus's, pinned by its own meta-test on each mutant alone
(``suites/harness/test_corpus.py``), not the gate's. Each side runs the episode's mutants'
suites (the corpus's ``suites``); ``--whole-suites`` runs every conformance check instead, and
then the regressions must include the pinned ones (others are listed, as the kill matrix would
find them), and each gate's engine leg runs the engine and server suites too (``--no-engine``
leaves it out; the corpus pins conformance checks only, so a selection of them runs no engine
check). The history report (``<out>/history.md`` and ``history.json``) gives per episode and
direction the verdict expected and found, the gate's exit status and groups, and the path of its
delta report (``<out>/<PR>/<direction>/gate.md``).

Exit status: 0 every gate gave its expected verdict; 1 one did not; 2 a bad option, or an
episode whose mutants no longer apply to the installed vLLM (the message names it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.jobs.speed import git_commit
from harness.jobs.warm import add_keep_warm_option
from harness.model_files import VllmNotInstalled, installed_file
from harness.mutation.corpus import CorpusMutant, load_corpus
from harness.mutation.file_mutants import MUTATIONS, MutationError

#: The episodes run by default: the seeds' fix of precomputed embeddings (one model file), and
#: the LM-only LoRA fix, whose bugs span the model file, NemotronH and a file every LoRA model
#: shares (``vllm/lora/peft_helper.py``, outside the model's own files).
DEFAULT_FIXES = ("#56398", "#56231")
#: The two directions of an episode: its name, whether the head is the fixed side, and the gate
#: exit status expected.
DIRECTIONS = (("fix", True, 0), ("bug", False, 1))


class HistoryError(RuntimeError):
    """An episode that cannot be built; the message names it and why."""


@dataclass(frozen=True)
class Episode:
    """One upstream pull request: the mutants that put its bugs back, and what they fail."""

    fix: str  # "#56398"
    mutants: tuple[CorpusMutant, ...]

    @property
    def slug(self) -> str:
        return self.fix.lstrip("#")

    @property
    def files(self) -> list[str]:
        """The vLLM files its bugs live in (paths from the checkout's root)."""
        return sorted({MUTATIONS[m.name].file.as_posix() for m in self.mutants})

    @property
    def suites(self) -> list[str]:
        """The checks its mutants are pinned against (files or check ids), in corpus order."""
        named = list(dict.fromkeys(s for m in self.mutants for s in m.suites))
        # a check of a file also named whole would be collected twice
        return [s for s in named if s.split("::")[0] == s or s.split("::")[0] not in named]

    @property
    def fails(self) -> dict[str, set[str]]:
        """Every check one of its bugs fails, with the substrings of the reasons the corpus pins
        for it: with the bugs together, whichever the check meets first fails it (the pre-#56398
        file's image embeddings stop at the truthiness before they reach the encoder)."""
        pinned: dict[str, set[str]] = {}
        for mutant in self.mutants:
            for check, why in mutant.fails.items():
                pinned.setdefault(check, set()).add(why)
        return pinned

    @property
    def xpass(self) -> set[str]:
        """The known deviations one of its bugs happens to fix, and none of the others fails."""
        return {check for m in self.mutants for check in m.xpass} - set(self.fails)


def episodes(fixes: Iterable[str]) -> list[Episode]:
    """The episodes of the pull requests ``fixes``, each with the ``vllm-file`` mutants of the
    corpus's records it fixed; :class:`HistoryError` for one the corpus has no such mutant of."""
    records = load_corpus()
    found = []
    for fix in fixes:
        mutants = tuple(
            m
            for record in records
            if fix in record.upstream
            for m in record.mutants
            # a record two pull requests fixed in turn has a mutant per pull request
            if m.kind == "vllm-file" and MUTATIONS[m.name].upstream == fix
        )
        if not mutants:
            known = sorted(
                {
                    MUTATIONS[m.name].upstream
                    for r in records
                    for m in r.mutants
                    if m.kind == "vllm-file"
                }
            )
            raise HistoryError(
                f"--fix: expected a pull request the corpus has vLLM-file mutants of "
                f"({', '.join(known)}), got {fix!r}"
            )
        found.append(Episode(fix, mutants))
    return found


def before_the_fix(episode: Episode) -> dict[str, str]:
    """Each of the episode's files with all its bugs put back (path -> text)."""
    texts: dict[str, str] = {}
    try:
        for path in episode.files:
            texts[path] = installed_file(Path(path)).read_text()
        for mutant in episode.mutants:
            mutation = MUTATIONS[mutant.name]
            path = mutation.file.as_posix()
            texts[path] = mutation.apply(texts[path])
    except MutationError as e:
        raise HistoryError(f"{episode.fix}: its bugs do not apply together: {e}") from e
    except VllmNotInstalled as e:
        raise HistoryError(f"{episode.fix}: {e}") from e
    return texts


def checkout(episode: Episode, folder: Path) -> tuple[Path, str, str]:
    """A git checkout with the episode's two commits; it and the revisions before and after."""
    repo = folder / "vllm-checkout"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "README.md").write_text(f"vLLM's files before and after {episode.fix}\n")
    for path, text in before_the_fix(episode).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    before = git_commit(repo, f"before {episode.fix}: its bugs put back")
    for path in episode.files:
        (repo / path).write_text(installed_file(Path(path)).read_text())
    after = git_commit(repo, f"{episode.fix}, as the installed release ships it")
    return repo, before, after


@dataclass
class Verdict:
    """One gate run against its expectation."""

    fix: str
    direction: str  # "fix" or "bug"
    base: str
    head: str
    expected_status: int
    status: int
    report: Path  # the gate's gate.md
    problems: list[str] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)  # regressions beyond the pinned (whole runs)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(
    episode: Episode, direction: str, document: dict[str, Any], *, whole: bool
) -> tuple[list[str], list[str]]:
    """What in the gate's ``document`` departs from the corpus's expectation for ``direction``
    (problems), and, for a whole-suite run, the regressions beyond the pinned ones."""
    problems: list[str] = []
    fails = episode.fails
    if direction == "fix":
        fixed = {e["id"] for e in document.get("fixes", [])}
        missing = sorted(set(fails) - fixed)
        problems += [f"pinned failure not fixed: {check}" for check in missing]
        problems += [f"regression: {e['id']}" for e in document.get("regressions", [])]
        return problems, []
    regressions = {e["id"]: e["head"] for e in document.get("regressions", [])}
    for check, reasons in sorted(fails.items()):
        if check not in regressions:
            problems.append(f"pinned failure not a regression: {check}")
            continue
        reason = regressions[check].get("reason", "")
        if not any(why in reason for why in reasons):
            expected = " or ".join(repr(why) for why in sorted(reasons))
            problems.append(
                f"{check}: expected a reason containing {expected}, got {reason[:200]!r}"
            )
    extra = sorted(set(regressions) - set(fails))
    if not whole:
        problems += [f"regression the corpus does not pin: {check}" for check in extra]
    fixed_deviations = {e["id"] for e in document.get("fixed_deviations", [])}
    problems += [
        f"known deviation the corpus says the bugs fix, not fixed: {check}"
        for check in sorted(episode.xpass - fixed_deviations)
    ]
    return problems, extra if whole else []


def run_gate(
    repo: Path,
    base: str,
    head: str,
    out: Path,
    selection: list[str],
    keep_warm: float | None,
    engine: bool = True,
) -> tuple[int, dict[str, Any] | None]:
    """``nemotron-vl-gate`` on one direction (its own process, its output shown as it runs)."""
    command = [
        *(sys.executable, "-m", "harness.jobs.gate"),
        *("--repo", str(repo), "--base", base, "--head", head, "--out", str(out)),
        *("--cache", str(out.parent / "cache")),
        *(["--keep-warm", f"{keep_warm:g}"] if keep_warm is not None else []),
        *([] if engine else ["--no-engine"]),
        *(["--", *selection] if selection else []),
    ]
    status = subprocess.run(command, cwd=ROOT, check=False).returncode
    gate_json = out / "gate.json"
    document = json.loads(gate_json.read_text()) if gate_json.is_file() else None
    return status, document


def run_episode(
    episode: Episode, out: Path, *, whole: bool, keep_warm: float | None, engine: bool = True
) -> list[Verdict]:
    folder = out / episode.slug
    repo, before, after = checkout(episode, folder)
    selection: list[str] = []
    if not whole:  # the checks the corpus pins the bugs against (pytest's own paths would add
        # to the gate's suites, not narrow them)
        listed = folder / "checks.txt"
        listed.write_text("".join(f"{suite}\n" for suite in episode.suites))
        selection = ["--checks-from", str(listed)]
    verdicts = []
    for direction, head_is_fixed, expected in DIRECTIONS:
        base, head = (before, after) if head_is_fixed else (after, before)
        gate_out = folder / direction
        print(
            f"gate-history: {episode.fix}, the {direction}: {base[:12]} → {head[:12]}", flush=True
        )
        status, document = run_gate(repo, base, head, gate_out, selection, keep_warm, engine)
        verdict = Verdict(
            episode.fix, direction, base, head, expected, status, gate_out / "gate.md"
        )
        if document is None:
            verdict.problems.append(f"the gate wrote no gate.json (exit status {status})")
        else:
            verdict.problems, verdict.extra = judge(episode, direction, document, whole=whole)
            verdict.groups = [
                {k: g[k] for k in ("type", "frame", "count", "message")}
                for g in document.get("groups", [])
            ]
            verdict.counts = {
                "regressions": len(document.get("regressions", [])),
                "fixes": len(document.get("fixes", [])),
                "fixed_deviations": len(document.get("fixed_deviations", [])),
            }
        if status != expected:
            verdict.problems.insert(0, f"exit status {status}, expected {expected}")
        verdicts.append(verdict)
    return verdicts


def render(episode_list: list[Episode], verdicts: list[Verdict], out: Path, whole: bool) -> str:
    scope = "every conformance check" if whole else "the checks the corpus pins each bug against"
    lines = [
        "# The gate on the model's upstream history",
        "",
        "Each upstream fix of the regression corpus, gated both ways on a vLLM checkout whose "
        "commits are the files before the fix (the corpus's mutants of its bugs, applied "
        "together to the installed release's files) and as the installed release ships them. "
        f"Each side ran {scope}. Expected verdicts are the corpus's (`fixtures/corpus.toml`): "
        "the fix exits 0 with every pinned failure among its fixes; the bug exits 1 with exactly "
        "the pinned failures as regressions, each for its pinned reason.",
        "",
        "| fix | files | direction | expected | exit status | regressions | fixes | groups "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    files = {e.fix: ", ".join(f"`{f}`" for f in e.files) for e in episode_list}
    for v in verdicts:
        lines.append(
            f"| {v.fix} | {files[v.fix]} | the {v.direction} | {v.expected_status} | {v.status} | "
            f"{v.counts.get('regressions', '—')} | {v.counts.get('fixes', '—')} | "
            f"{len(v.groups)} | {'as expected' if v.ok else '**not as expected**'} |"
        )
    for v in verdicts:
        lines += ["", f"## {v.fix}, the {v.direction}: `{v.report.relative_to(out)}`", ""]
        lines += [f"- problem: {p}" for p in v.problems] or ["- as the corpus expects"]
        lines += [
            f"- group: {g['count']} checks: `{g['type']}` from `{g['frame']}`" for g in v.groups
        ]
        if v.extra:
            lines.append(
                f"- {len(v.extra)} regression(s) beyond the pinned ones (checks outside the "
                "corpus's suites for these bugs): "
                + ", ".join(f"`{c}`" for c in v.extra[:10])
                + (" ..." if len(v.extra) > 10 else "")
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nemotron-vl-gate-history", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gate-history")
    parser.add_argument(
        "--fix",
        action="append",
        help=f"an upstream pull request of the corpus (repeatable; default: {DEFAULT_FIXES})",
    )
    parser.add_argument(
        "--whole-suites", action="store_true", help="run every conformance check on each side"
    )
    parser.add_argument("--no-engine", action="store_true", help="leave each gate's engine leg out")
    add_keep_warm_option(parser, "each gate's vLLM fork server (the next gate forks from it)")
    try:
        args = parser.parse_args(argv)
        chosen = episodes(args.fix or DEFAULT_FIXES)
        for episode in chosen:
            before_the_fix(episode)  # every episode builds before any gate runs
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    except HistoryError as e:
        print(f"nemotron-vl-gate-history: error: {e}", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    verdicts = [
        v
        for episode in chosen
        for v in run_episode(
            episode,
            out,
            whole=args.whole_suites,
            keep_warm=args.keep_warm,
            engine=not args.no_engine,
        )
    ]
    (out / "history.md").write_text(render(chosen, verdicts, out, args.whole_suites))
    (out / "history.json").write_text(
        json.dumps(
            [
                {
                    "fix": v.fix,
                    "direction": v.direction,
                    "base": v.base,
                    "head": v.head,
                    "expected_status": v.expected_status,
                    "status": v.status,
                    "ok": v.ok,
                    "problems": v.problems,
                    "groups": v.groups,
                    "counts": v.counts,
                    "extra": v.extra,
                    "report": str(v.report.relative_to(out)),
                }
                for v in verdicts
            ],
            indent=2,
        )
        + "\n"
    )
    print((out / "history.md").read_text())
    return 0 if all(v.ok for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
