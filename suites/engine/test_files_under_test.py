"""Files under test reach the engine's own processes: a ``vllm-engine-file:`` target's model file
(a pull request's) is what vLLM's engine core and worker import, not the installed one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.model_files import MODEL_MODULE
from harness.targets import Target
from harness.targets.engine import ENGINE_SPEC, Sampling, engine_prompt
from harness.targets.engine.target import EngineFileTarget, EngineTarget
from suites.engine.conftest import TEXT

pytestmark = pytest.mark.concern("engine")


def test_a_model_file_under_test_is_what_every_engine_process_imports(
    target: Target, tmp_path: Path
) -> None:
    if not isinstance(target, EngineTarget):
        pytest.skip("runs with the CPU build's environment (--target=vllm-engine)")
    import importlib.util

    found = importlib.util.find_spec(MODEL_MODULE)
    assert found is not None
    assert found.origin is not None
    marks = tmp_path / "imported-by"
    # The installed file, marked: each process that imports it writes its pid.
    under_test = tmp_path / "vllm" / "model_executor" / "models" / Path(found.origin).name
    under_test.parent.mkdir(parents=True)
    under_test.write_text(
        Path(found.origin).read_text()
        + f"\nimport os as _os\nopen({str(marks)!r}, 'a').write(f'{{_os.getpid()}}\\n')\n"
    )
    files = EngineFileTarget([under_test])
    files.load()
    engine = files.engine(ENGINE_SPEC)
    try:
        answer = engine.generate([engine_prompt(TEXT)], Sampling(max_tokens=2))[0]
        pids = {int(line) for line in marks.read_text().split()}
        assert len(answer.tokens) == 2
        assert os.getpid() in pids, (
            "this process (the engine's front end) imported the installed file"
        )
        # The model runs in the worker (in the engine core where it has no worker of its own).
        named = engine.processes.items()
        runners = [p for p, n in named if "Worker" in n] or [p for p, n in named if "Engine" in n]
        assert runners, f"no engine core or worker among the engine's processes: {named}"
        missed = {pid: engine.processes[pid] for pid in runners if pid not in pids}
        assert not missed, f"these ran the installed file, not the one under test: {missed}"
    finally:
        files.shutdown_engines()
