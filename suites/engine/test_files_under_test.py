"""Files under test reach the engine's own processes: a ``vllm-engine-file:`` target's model file
(a pull request's) is what vLLM's engine core and worker import, not the installed one. The same
engine then shows what a check gets when an engine core dies: vLLM's error, and no process of
the engine left once it is stopped."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.model_files import MODEL_MODULE
from harness.targets import Target
from harness.targets.engine import ENGINE_SPEC, EngineError, Sampling, engine_prompt
from harness.targets.engine.target import EngineFileTarget, EngineTarget
from suites.engine.conftest import TEXT

pytestmark = pytest.mark.concern("engine")


@pytest.fixture(scope="module")
def marked_file(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed model file with two lines added: each process that imports it writes its
    pid into the file this fixture gives (the model file lies beside it)."""
    if not isinstance(target, EngineTarget):
        pytest.skip("runs with the CPU build's environment (--target=vllm-engine)")
    import importlib.util

    found = importlib.util.find_spec(MODEL_MODULE)
    assert found is not None
    assert found.origin is not None
    folder = tmp_path_factory.mktemp("file-under-test")
    marks = folder / "imported-by"
    under_test = folder / "vllm" / "model_executor" / "models" / Path(found.origin).name
    under_test.parent.mkdir(parents=True)
    under_test.write_text(
        Path(found.origin).read_text()
        + f"\nimport os as _os\nopen({str(marks)!r}, 'a').write(f'{{_os.getpid()}}\\n')\n"
    )
    return marks


@pytest.fixture(scope="module")
def files(marked_file: Path) -> Iterator[EngineFileTarget]:
    under_test = next(marked_file.parent.glob("vllm/model_executor/models/*.py"))
    target = EngineFileTarget([under_test])
    target.load()
    yield target
    target.shutdown_engines()


def test_a_model_file_under_test_is_what_every_engine_process_imports(
    files: EngineFileTarget, marked_file: Path
) -> None:
    engine = files.engine(ENGINE_SPEC)
    answer = engine.generate([engine_prompt(TEXT)], Sampling(max_tokens=2))[0]
    pids = {int(line) for line in marked_file.read_text().split()}
    assert len(answer.tokens) == 2
    assert os.getpid() in pids, "this process (the engine's front end) imported the installed file"
    # The model runs in the worker (in the engine core where it has no worker of its own).
    named = engine.processes.items()
    runners = [p for p, n in named if "Worker" in n] or [p for p, n in named if "Engine" in n]
    assert runners, f"no engine core or worker among the engine's processes: {named}"
    missed = {pid: engine.processes[pid] for pid in runners if pid not in pids}
    assert not missed, f"these ran the installed file, not the one under test: {missed}"


def test_an_engine_core_that_dies_fails_the_request_and_leaves_no_process(
    files: EngineFileTarget,
) -> None:
    import psutil

    engine = files.engine(ENGINE_SPEC)
    cores = [pid for pid, name in engine.processes.items() if "EngineCore" in name]
    assert cores, f"no engine core among the engine's processes: {engine.processes}"
    os.kill(cores[0], signal.SIGKILL)
    psutil.Process(cores[0]).wait(10)
    with pytest.raises(EngineError, match=r"EngineCore.*\(pid \d+\)"):
        engine.generate([engine_prompt(TEXT)], Sampling(max_tokens=2))
    assert engine.dead, "the engine is not marked dead: the next use would not build a new one"
    files.shutdown_engines()
    left = []
    for pid, name in engine.processes.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(f"{name} (pid {pid})")
        except psutil.NoSuchProcess:
            continue
    assert not left, f"the engine's processes outlived its stop: {left}"
    assert not files.killed, f"the engine's processes had to be killed: {files.killed}"
