"""How long a user waits: the main job, and the pull-request gate with its base side cached.

    nemotron-vl-speed [--out DIR]

Runs, on this machine, one after the other:

1. the main job (``nemotron-vl-conformance``) on every available target, three times, with
   outcomes kept in a folder of its own (:mod:`harness.jobs.kept`): every target run
   (``--rerun``); nothing changed since (every target's outcomes reused); and the vLLM target's
   inputs changed (``--rerun vllm``: vLLM runs, the reference's outcomes are reused), as after an
   edit to vLLM's model file;
2. the gate (``nemotron-vl-gate``) on a change to the installed vLLM's model file that alters
   no behaviour (one comment line), in a git checkout made here (:func:`installed_checkout`):
   once to fill its cache of the base side's results, then again, timed, as a pull request's
   later pushes run it;
3. the main job with its fork servers kept warm (``--keep-warm``, :mod:`harness.jobs.warm`),
   as a developer runs it again and again: once to start them, then every target run, and the
   vLLM target's inputs changed, each forking from them; they are ended at the end.

Until the third step, the runs find no warm server (their folder is one of this command's).

It writes ``DIR/speed.md`` and ``speed.json`` (default ``reports/benchmarks/``): each command's
wall time, and the gate's against the main job's (the goal: at most 1.5 times). Nothing is
asserted: the numbers depend on the machine, so the report names it (cores, CPU model).
Exit status: 0 when every command ran (whatever the times), 2 when one failed to.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import ROOT
from harness.jobs.conformance import available_targets
from harness.jobs.kept import KEPT_OUTCOMES_ENV
from harness.jobs.warm import WARM_SERVERS_ENV, retire_all
from harness.model_files import MODEL_FILE, installed_model_file

#: The gate's wall time with the base side cached, at most this many main jobs.
GATE_GOAL = 1.5
#: The main job that runs every target: what the gate is measured against.
MAIN_JOB = "main job, every target run"


def git_commit(repo: Path, message: str) -> str:
    """Commit everything in ``repo``; its new revision."""
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(
        [
            *("git", "-C", str(repo)),
            *("-c", "user.email=gate@harness", "-c", "user.name=gate"),
            *("commit", "-qm", message),
        ],
        check=True,
    )
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def installed_checkout(folder: Path) -> tuple[Path, str]:
    """A git repository with the installed vLLM's model file at its path in vLLM, and its
    first (base) commit."""
    repo = folder / "vllm-checkout"
    (repo / MODEL_FILE).parent.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / MODEL_FILE).write_text(installed_model_file().read_text())
    (repo / "README.md").write_text("a vLLM checkout\n")
    return repo, git_commit(repo, "base: as released")


@dataclass
class Timed:
    command: str
    seconds: float
    exit_status: int


def timed(command: list[str], log: Path, scratch: Path, env: dict[str, str] | None = None) -> Timed:
    """``command`` run from the harness's root (with ``env`` added to the environment), its
    output to ``log``; reported by its script's name, ``scratch`` written ``TMP``."""
    print(f"$ {shlex.join(command)}", flush=True)
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(
            command,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        ).returncode
    shown = shlex.join([Path(command[0]).name, *command[1:]]).replace(str(scratch), "TMP")
    result = Timed(shown, round(time.monotonic() - start, 1), status)
    print(f"  {result.seconds} s, exit status {status} (output: {log})", flush=True)
    return result


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def render(document: dict[str, object], runs: dict[str, Timed]) -> str:
    lines = [
        "# How long a user waits",
        "",
        f"Machine: {document['cores']} cores, {document['cpu']}. Command: `nemotron-vl-speed`.",
        "",
        "| run | command | wall (s) | exit status |",
        "|---|---|---|---|",
    ]
    for name, run in runs.items():
        lines.append(f"| {name} | `{run.command}` | {run.seconds} | {run.exit_status} |")
    lines += [
        "",
        f"The gate with its base side cached took {document['gate_ratio']} times the main job "
        "that runs every target "
        f"(goal: at most {GATE_GOAL}).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-speed", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    runs: dict[str, Timed] = {}
    with tempfile.TemporaryDirectory(prefix="nemotron-vl-speed-") as scratch:
        work = Path(scratch)
        conformance = [str(bin_dir / "nemotron-vl-conformance"), "--out", str(work / "main")]
        warm = work / "warm"
        env = {KEPT_OUTCOMES_ENV: str(work / "kept"), WARM_SERVERS_ENV: str(warm)}
        has_vllm = "vllm" in available_targets()
        runs[MAIN_JOB] = timed([*conformance, "--rerun"], work / "main-all.log", work, env)
        runs["main job, nothing changed"] = timed(conformance, work / "main-kept.log", work, env)
        if has_vllm:
            runs["main job, vLLM's inputs changed"] = timed(
                [*conformance, "--rerun", "vllm"], work / "main-vllm.log", work, env
            )
        repo, base = installed_checkout(work)
        model = repo / MODEL_FILE
        model.write_text(model.read_text() + "\n# a comment: the change alters no behaviour\n")
        head = git_commit(repo, "a comment")
        gate = [
            str(bin_dir / "nemotron-vl-gate"),
            *("--repo", str(repo), "--base", base, "--head", head),
            *("--cache", str(work / "gate-cache"), "--out", str(work / "gate")),
        ]
        runs["gate, first push (fills the cache)"] = timed(gate, work / "gate-first.log", work, env)
        runs["gate, base side cached"] = timed(gate, work / "gate-cached.log", work, env)
        try:
            runs["main job, every target run, keeping its servers warm"] = timed(
                [*conformance, "--rerun", "--keep-warm", "10"], work / "warm-start.log", work, env
            )
            runs["main job, every target run, servers warm"] = timed(
                [*conformance, "--rerun"], work / "warm-all.log", work, env
            )
            if has_vllm:
                runs["main job, vLLM's inputs changed, servers warm"] = timed(
                    [*conformance, "--rerun", "vllm"], work / "warm-vllm.log", work, env
                )
        finally:
            retire_all(folder=warm)
    main_s = runs[MAIN_JOB].seconds
    document: dict[str, object] = {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "runs": {name: asdict(run) for name, run in runs.items()},
        "gate_ratio": round(runs["gate, base side cached"].seconds / main_s, 2) if main_s else None,
        "gate_goal": GATE_GOAL,
    }
    (out / "speed.json").write_text(json.dumps(document, indent=2) + "\n")
    markdown = render(document, runs)
    (out / "speed.md").write_text(markdown)
    print(f"\n{markdown}\nreport: {out / 'speed.md'}")
    # The gate exits 0 on this change (it alters no behaviour); 1 would be a regression found.
    return 0 if all(run.exit_status == 0 for run in runs.values()) else 2


if __name__ == "__main__":
    raise SystemExit(main())
