"""``--target`` and ``--device``: pick the implementation under test and where tensors live.

Fixtures: ``target`` (loaded once), ``device``, ``make_model`` / ``model`` (the target's model
of a checkpoint variant, built once per variant and shared), ``request_runs`` (each catalogued
request through the target's engine, run once and shared). The ``concern`` marker names what a
check exercises (``model``, ``weights``, ``minimal``, ``metadata``, ...); the target says what
that runs on (a real model, real processing info, or classes and functions), and the results
record it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.requests import RequestResult
from harness.numerics import Numerics, current_numerics
from harness.targets import (
    TARGET_CHOICES,
    ModelSpec,
    MultimodalModel,
    NeedsCuda,
    NotImplementedByTarget,
    Target,
    TargetLoadError,
    TargetUnavailable,
    resolve_target,
)

_TARGET_KEY = pytest.StashKey[Target]()
#: Why the run stopped before its checks ran (a target that failed to load), for the results.
STOPPED_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemotron-vl", "Nano-Nemotron VL conformance harness")
    group.addoption(
        "--target",
        default="reference",
        help=f"implementation under test: {' | '.join(TARGET_CHOICES)} (default: reference)",
    )
    group.addoption(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where tensors live, for targets that support it (default: cpu)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    try:
        target = resolve_target(config.getoption("--target"))
    except TargetLoadError as e:
        pytest.exit(f"harness could not run: {e}", returncode=2)
    device = config.getoption("--device")
    if device not in target.devices:
        pytest.exit(
            f"harness could not run: --device: target {target.name!r} runs on "
            f"{sorted(target.devices)}, got {device!r}",
            returncode=2,
        )
    if device == "cuda" and not torch.cuda.is_available():
        pytest.exit(
            "harness could not run: --device cuda, but no CUDA device is visible "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda})",
            returncode=2,
        )
    config.stash[_TARGET_KEY] = target


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = config.getoption("--device") == "cuda" and torch.cuda.is_available()
    for item in items:
        if item.get_closest_marker("gpu") is not None and not cuda:
            item.add_marker(
                pytest.mark.skip(reason="gpu check: needs a CUDA device and --device cuda")
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """A check the target cannot build on a CPU, or whose input the target does not implement,
    skips with the target's reason."""
    try:
        return (yield)
    except NeedsCuda as e:
        pytest.skip(f"needs CUDA: {e}")
    except NotImplementedByTarget as e:
        pytest.skip(f"not implemented by target {current_target(item.config).name!r}: {e}")


def current_target(config: pytest.Config) -> Target:
    return config.stash[_TARGET_KEY]


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> Target:
    """The implementation under test (``--target``), loaded on first use.

    A target that is not installed skips its checks with the reason; a target that fails to load
    (a model file whose imports the installed vLLM lacks) stops the run with one clear error and
    exit status 2, rather than an error per check.
    """
    target = current_target(request.config)
    try:
        target.load()
    except TargetUnavailable as e:
        pytest.skip(f"target {target.name!r} unavailable: {e}")
    except TargetLoadError as e:
        request.config.stash[STOPPED_KEY] = str(e)
        pytest.exit(f"harness could not run: {e}", returncode=2)
    return target


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """Where tensors live (``--device``)."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture
def make_model(target: Target, device: torch.device) -> Callable[..., MultimodalModel]:
    """The target's model of a checkpoint variant: ``make_model(video_temporal_patch_size=2)``
    (fields of :class:`ModelSpec`), served with ``serving`` (a :class:`ServingConfig`, by
    default :data:`DEFAULT_SERVING`)."""

    def make(serving: ServingConfig = DEFAULT_SERVING, **spec_fields: object) -> MultimodalModel:
        try:
            return target.model(ModelSpec(**spec_fields), device, serving)  # type: ignore[arg-type]
        except TargetUnavailable as e:
            pytest.skip(f"target {target.name!r} unavailable: {e}")
        except NeedsCuda as e:
            pytest.skip(f"needs CUDA: {e}")

    return make


@pytest.fixture
def model(make_model: Callable[..., MultimodalModel]) -> MultimodalModel:
    """The target's model of the default variant (static tiles, T = 1, audio)."""
    return make_model()


class RequestRuns:
    """Each catalogued request form (:data:`harness.inputs.catalogue.REQUEST_FORMS`) through the
    target's engine, served with a configuration (:data:`DEFAULT_SERVING` unless given), run on
    first use and kept: the result, or the exception it raised (raised again).

    A result is kept under the numerics it was computed with (:mod:`harness.numerics`): a check
    that runs at another thread count (the main job hands a finished process's cores to those
    still running) gets the request run again at its own, so that a check comparing a new run
    with the kept one bit for bit compares two runs of the same numerics. The oracle's runs
    (``per_numerics=False``) are kept whatever the count: they are compared within bounds
    only, far above another count's rounding in fp32 (:mod:`harness.oracles.cache`)."""

    def __init__(self, target: Target, device: torch.device, *, per_numerics: bool = True) -> None:
        self.target = target
        self.device = device
        self.per_numerics = per_numerics
        self._outcomes: dict[
            tuple[str, bool, ServingConfig, ModelSpec | None, Numerics | None],
            RequestResult | Exception,
        ] = {}

    def model(
        self,
        form: str,
        serving: ServingConfig = DEFAULT_SERVING,
        spec: ModelSpec | None = None,
    ) -> MultimodalModel:
        return self.target.model(spec or FORMS_BY_NAME[form].spec, self.device, serving)

    def run(
        self,
        form: str,
        *,
        cached: bool = False,
        serving: ServingConfig = DEFAULT_SERVING,
        spec: ModelSpec | None = None,
    ) -> RequestResult:
        """``form``'s request on its checkpoint variant, or on ``spec`` where given."""
        if spec == FORMS_BY_NAME[form].spec:
            spec = None  # the same run
        key = (form, cached, serving, spec, current_numerics() if self.per_numerics else None)
        if key not in self._outcomes:
            model = self.model(form, serving, spec)  # NeedsCuda etc. propagate: not an outcome
            try:
                catalogued = FORMS_BY_NAME[form]
                request = catalogued.request_for(spec) if spec else catalogued.request
                self._outcomes[key] = model.run_request(request, cached=cached)
            except Exception as e:
                self._outcomes[key] = e
        outcome = self._outcomes[key]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


@pytest.fixture(scope="session")
def request_runs(target: Target, device: torch.device) -> RequestRuns:
    return RequestRuns(target, device)


@pytest.fixture(scope="session")
def reference_runs(target: Target) -> RequestRuns:
    """The reference's runs of the catalogued requests (fp32, on the CPU): the oracle of the
    parity checks, shared by them. On the reference target such a check would compare the
    reference with itself, so it does not run there."""
    if target.name == "reference":
        pytest.skip("the reference is the oracle of the parity checks")
    from harness.oracles.cache import oracle_target

    return RequestRuns(oracle_target(target.name), torch.device("cpu"), per_numerics=False)


def runs_on(item: pytest.Item) -> str | None:
    """What a check runs on for the current target (its ``concern`` marker), or None."""
    marker = item.get_closest_marker("concern")
    if marker is None:
        return None
    return current_target(item.config).runs_on(str(marker.args[0]))
