"""Root conftest: loads the harness's pytest plugin for every run from this tree."""

from harness import environment

# No model hub at run time: configs and tokenizers are built in code. (VLLM_TARGET_DEVICE is set
# by the vllm target itself, before its first import of vLLM.)
environment.apply(environment.OFFLINE)
# A main job started by a test runs its targets: no test reads outcomes another run kept
# (harness.jobs.kept); the tests of that reuse name a folder of their own.
environment.apply({"NEMOTRON_VL_KEPT_OUTCOMES": "off"})

pytest_plugins = ("harness.plugin",)
