"""The targets: selection, vllm-file module placement and load errors, identities."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.model_files import MODEL_MODULE
from harness.targets import TargetLoadError, resolve_target
from harness.targets.reference import ReferenceTarget
from harness.targets.vllm import VllmFileTarget
from harness.targets.vllm.files import module_name_for
from suites.harness.helpers import ROOT, needs_vllm, run_suites


def test_resolve_known_targets():
    assert resolve_target("reference").name == "reference"
    assert resolve_target("vllm").name == "vllm"


def test_resolve_rejects_unknown_target():
    with pytest.raises(TargetLoadError, match=r"--target: expected one of .*got 'vlm'"):
        resolve_target("vlm")


@pytest.mark.parametrize(
    ("relative", "module"),
    [
        ("pr/vllm/model_executor/models/nano_nemotron_vl.py", MODEL_MODULE),
        ("pr/vllm/model_executor/models/radio.py", "vllm.model_executor.models.radio"),
        (
            "x/vllm/transformers_utils/processors/nano_nemotron_vl.py",
            "vllm.transformers_utils.processors.nano_nemotron_vl",
        ),
        ("downloads/nano_nemotron_vl.py", MODEL_MODULE),
        ("downloads/parakeet.py", "vllm.model_executor.models.parakeet"),
        ("downloads/nemotron_h.py", "vllm.model_executor.models.nemotron_h"),
    ],
)
def test_module_placement(tmp_path, relative, module):
    assert module_name_for(tmp_path / relative) == module


def test_unplaceable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("")
    with pytest.raises(TargetLoadError, match=r"cannot tell which vLLM module .*model\.py"):
        VllmFileTarget([path])


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(TargetLoadError, match=r"no_such\.py: no such file"):
        resolve_target(f"vllm-file:{tmp_path / 'no_such.py'}")


def test_empty_file_list_is_a_clear_error():
    with pytest.raises(TargetLoadError, match="got no paths"):
        resolve_target("vllm-file:")


def test_reference_identity_hashes_its_files():
    identity = ReferenceTarget().identity()
    assert identity.name == "reference"
    assert "reference_impl/model.py" in identity.files
    assert all(len(digest) == 64 for digest in identity.files.values())


def test_vllm_file_identity_hashes_the_given_files(tmp_path):
    path = tmp_path / "vllm" / "model_executor" / "models" / "nano_nemotron_vl.py"
    path.parent.mkdir(parents=True)
    path.write_text("# one\n")
    first = VllmFileTarget([path]).identity().files[str(path)]
    path.write_text("# two\n")
    assert VllmFileTarget([path]).identity().files[str(path)] != first


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_import_failure_stops_the_run_with_one_clear_error(tmp_path):
    """A pull-request file that needs a name the installed vLLM lacks: exit status 2 and one
    error naming the file and the missing name, not an error per check."""
    path = tmp_path / "vllm" / "model_executor" / "models" / "nano_nemotron_vl.py"
    path.parent.mkdir(parents=True)
    path.write_text("from vllm.model_executor.models.utils import not_in_this_release\n")
    run = run_suites(tmp_path, f"--target=vllm-file:{path}")
    assert run.returncode == 2, run.output[-3000:]
    assert f"{path}" in run.output
    assert "not_in_this_release" in run.output
    assert run.output.count("harness could not run") == 1


#: A check whose forms fail a pinned vLLM deviation on vLLM (the fp32 checkpoint's towers) and
#: that pass as that deviation's: it reads the deviations through ``pinned_deviations``.
PINNED_IN_A_CHECK = (
    "suites/conformance/test_pairwise.py::"
    "test_a_variant_of_the_covering_array_serves_the_catalogue_as_the_reference"
    "[v2-static-audio-t1-saved-float32]"
)


@needs_vllm
@pytest.mark.vllm
def test_the_installed_file_as_a_vllm_file_target_has_vllms_deviations(tmp_path):
    """The installed model file, copied, is a ``vllm-file:`` target with vLLM's known deviations
    inside checks too: the gate's two sides and every mutant of the score run that way, so one
    it lacked would be a FAIL on an unchanged file (it was: the fixture read
    ``fixtures/deviations/vllm-file:PATH.toml``, none, and 33 mutants were counted killed)."""
    from harness.model_files import installed_model_file

    path = tmp_path / "src" / "vllm" / "model_executor" / "models" / "nano_nemotron_vl.py"
    path.parent.mkdir(parents=True)
    path.write_text(installed_model_file().read_text())
    run = run_suites(tmp_path / "run", f"--target=vllm-file:{path}", suite=PINNED_IN_A_CHECK)
    assert run.returncode == 0, run.output[-3000:]
    assert run.outcome(PINNED_IN_A_CHECK)["outcome"] == "pass"
    assert "known deviation" in json.dumps(run.outcome(PINNED_IN_A_CHECK).get("measured", {}))


RESOLVED_BEFORE = """
from pathlib import Path
import sys

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import ModelSpec
from harness.model_files import MODEL_MODULE
from harness.targets.vllm.build import check_registered_class, engine_config
from harness.targets.vllm.files import load_model_files
from harness.targets.vllm.runtime import import_vllm_module
from vllm.model_executor.model_loader.utils import get_model_architecture

installed = import_vllm_module(MODEL_MODULE)
config = engine_config(checkpoint_folder(ModelSpec()))
resolved, _ = get_model_architecture(config.model_config)
assert resolved is installed.NemotronH_Nano_VL_V2, resolved
module = load_model_files([Path(sys.argv[1])])
assert module.NemotronH_Nano_VL_V2 is not resolved
check_registered_class(module, config)
print("RESOLVED", get_model_architecture(config.model_config)[0].__module__, module.__file__)
"""


@needs_vllm
@pytest.mark.vllm
def test_a_class_resolved_before_the_files_replaced_it_is_resolved_again(tmp_path):
    """vLLM caches the class it resolved for a folder: a process (or the parent of a forked
    child) that built the installed model before loads a ``vllm-file:`` target's files and
    must build their class, not fail naming the installed one (it did, under pytest-xdist,
    where another module of the worker had built the installed model first)."""
    from harness.model_files import installed_model_file

    path = tmp_path / "vllm" / "model_executor" / "models" / "nano_nemotron_vl.py"
    path.parent.mkdir(parents=True)
    path.write_text(installed_model_file().read_text())
    proc = subprocess.run(
        [sys.executable, "-c", RESOLVED_BEFORE, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"RESOLVED {MODEL_MODULE} {path}" in proc.stdout


def test_bad_target_option_exits_2(tmp_path):
    run = run_suites(tmp_path, "--target=vlm", "--co")
    assert run.returncode == 2
    assert "--target: expected one of" in run.output


def test_cuda_without_a_device_exits_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here: this checks the CPU-only message")
    run = run_suites(tmp_path, "--device=cuda", "--co")
    assert run.returncode == 2
    assert "no CUDA device is visible" in run.output


def test_results_json_records_target_and_outcomes(tmp_path):
    run = run_suites(tmp_path, "-k", "test_the_upstream_reproducer")
    assert run.returncode == 0, run.output[-3000:]
    assert run.results is not None
    assert run.results["target"]["name"] == "reference"
    assert run.results["checks"] == [
        {
            "id": "suites/conformance/test_passthrough.py::test_the_upstream_reproducer",
            "outcome": "pass",
            "reason": "",
            "runs_on": "real model",
            "serving": "default",
            "serving_args": ["--enable-mm-embeds"],
            "duration_s": run.results["checks"][0]["duration_s"],
        }
    ]
    json.dumps(run.results)  # serialisable as written
    assert Path(tmp_path / "results.json").is_file()


def test_checkpoint_folders_of_one_spec_are_identical(tmp_path):
    """A folder is a function of its spec and seed: two writes (whatever the global RNG did in
    between) hold the same tensors, so a model built from it is the same in every process and
    CPU/CUDA and cross-target comparisons compare implementations, not seeds."""
    import torch

    from harness.checkpoints.spec import ModelSpec
    from harness.checkpoints.writer import write_checkpoint
    from reference_impl.checkpoint import read_weights

    spec = ModelSpec(audio=False)
    first = read_weights(write_checkpoint(spec, tmp_path / "a"))
    torch.randn(100)  # move the global RNG
    second = read_weights(write_checkpoint(spec, tmp_path / "b"))
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name
    other = read_weights(write_checkpoint(spec, tmp_path / "c", seed=1))
    assert not torch.equal(other["mlp1.1.weight"], first["mlp1.1.weight"])


def test_vllm_target_without_vllm_is_unavailable(monkeypatch):
    """Without vLLM installed the vllm targets skip with this reason, they do not error."""
    from harness.targets import TargetUnavailable
    from harness.targets.vllm import runtime
    from harness.targets.vllm import target as vllm_target

    monkeypatch.setattr(runtime, "vllm_version", lambda: None)
    monkeypatch.setattr(vllm_target, "vllm_version", lambda: None)
    with pytest.raises(TargetUnavailable, match="vLLM is not installed"):
        vllm_target.VllmTarget().load()
    assert vllm_target.VllmTarget().identity().version == "not installed"


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_file_typing_cases_check_the_given_file(tmp_path):
    """The pre-#56398 video union (pixels only) in a given file: the typing cases that use video
    embeddings as its member fail, so mypy read the given file, not the installed one."""
    from harness.model_files import MODEL_FILE, installed_model_file

    source = installed_model_file().read_text()
    union = "    NanoNemotronVLVideoPixelInputs | NanoNemotronVLVideoEmbeddingInputs\n"
    assert source.count(union) == 1, "the installed file's video union changed"
    path = tmp_path / "src" / MODEL_FILE
    path.parent.mkdir(parents=True)
    path.write_text(source.replace(union, "    NanoNemotronVLVideoPixelInputs\n"))
    run = run_suites(
        tmp_path, f"--target=vllm-file:{path}", suite="suites/conformance/test_typing.py"
    )
    assert run.returncode == 1, run.output[-3000:]
    typing = "suites/conformance/test_typing.py::"
    passing = f"{typing}test_passing_cases_type_check"
    assert run.outcomes("fail") == {
        passing,
        f"{typing}test_failing_cases_fail_with_the_named_codes",
    }
    assert "pass_contracts.py" in run.outcome(passing)["reason"]


def test_unknown_reference_mutant_exits_2(tmp_path):
    run = run_suites(tmp_path, "--target=reference-mutant:nope", "--co")
    assert run.returncode == 2
    assert "reference-mutant: expected one of" in run.output


IDENTITY_THEN_PLATFORM = """
from harness.targets.vllm import VllmTarget
VllmTarget().identity()
from vllm.platforms import current_platform
print(current_platform.device_type)
"""


@needs_vllm
def test_the_vllm_targets_identity_leaves_vllm_on_the_cpu():
    """The main job asks the target's identity (the hashes of its files) before any check: on a
    CPU-only host with no VLLM_TARGET_DEVICE, that first touch of vLLM's packages must already
    be on the CPU, or vLLM settles on no platform and every model build fails ("Failed to infer
    device type": every vLLM check of a main job run outside nox did)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    done = subprocess.run(
        [sys.executable, "-c", IDENTITY_THEN_PLATFORM],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "cpu", done.stdout[-2000:]
