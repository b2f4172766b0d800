"""``--record-config-reads PATH``: which config fields the model's vLLM code reads, recorded on
the real config objects; ``--ignore-config-field SECTION.FIELD``: as if vLLM ignored one.

:class:`ConfigReads` replaces transformers' ``PreTrainedConfig.__getattribute__`` and
``to_dict`` for as long as it is installed. A read counts when its caller is one of the model
family's installed files (:data:`WATCHED_MODULES`): the read is kept with its section, its field,
the line that read it and the context it ran in (a check, or a model build). Reads by transformers'
or vLLM's shared code (the engine's config, the loader) do not count: they are the same for every
model.

A config object's section comes from its ``model_type``: ``config`` (the checkpoint's top level),
``text_config``, ``vision_config``, ``sound_config``; ``vision_config.args`` (a plain dict of
RADIO's timm arguments) is wrapped so that its keys are recorded too. Objects vLLM builds from
them (its own ``RadioConfig``, its Parakeet config) are named by their class, marked derived: a
read there is not a checkpoint field, and ignoring one is not offered.

Ignoring a field (``ignore=("text_config", "n_groups")``) makes every read of it from a watched
file see the value the default variant's checkpoint holds (absent where that checkpoint has no
such field): how vLLM would behave if it hard-coded the common value. The config-field inventory
(:mod:`harness.jobs.config_fields`) runs the checks that read a field this way to find which of
them fail.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.checkpoints.spec import ModelSpec
from harness.jobs.results import replace_text
from harness.model_files import (
    CONFIG_MODULES,
    EVS_FILE,
    MODEL_FAMILY_MODULES,
    PROCESSOR_MODULE,
    VllmNotInstalled,
    file_of,
    installed_file,
    module_of,
)
from harness.plugin.builds import patch_builds

#: The modules whose reads count: the model family's files, its EVS helpers, its configs.
WATCHED_MODULES = (*MODEL_FAMILY_MODULES, module_of(EVS_FILE), *CONFIG_MODULES)
#: The checkpoint's sections by the ``model_type`` their config object carries.
SECTIONS = {
    "NemotronH_Nano_VL_V2": "config",
    "nemotron_h": "text_config",
    "radio": "vision_config",
    "parakeet_encoder": "sound_config",
}
ARGS_SECTION = "vision_config.args"
#: The keyword options vLLM's model code gives the processor (engine-level ``mm_processor_kwargs``
#: among them) and those a request gives its call.
OPTION_SECTION = "processor option"
#: Sections of the checkpoint's own config objects and the processor's options (a field there
#: can be ignored).
CHECKPOINT_SECTIONS = (*SECTIONS.values(), ARGS_SECTION, OPTION_SECTION)
#: What an ignored processor option that the processor requires is given instead: the default
#: variant's engine context (the others are left out, so the processor's own default applies).
REQUIRED_OPTIONS = {"max_model_len": 4096}
#: Keyword arguments that are no option: the config and tokenizer the processor is built on, and
#: a call's request (its text and media) and output format.
NOT_OPTIONS = frozenset(
    {"config", "tokenizer", "text", "images", "videos", "audios", "return_tensors"}
)
#: What a field that the default checkpoint lacks reads as while it is ignored.
ABSENT = object()


def section_values(config: Mapping[str, Any], section: str) -> Mapping[str, Any]:
    """The fields of ``section`` in a ``config.json`` content (none for a section it lacks, a
    derived object's or the processor's options)."""
    if section == "config":
        return config
    if section == ARGS_SECTION:
        return (config.get("vision_config") or {}).get("args") or {}
    if section in SECTIONS.values():
        return config.get(section) or {}
    return {}


class ConfigReadsError(ValueError):
    """A field to ignore that is not one of the checkpoint's sections."""


@dataclass(frozen=True)
class FieldRead:
    """A field of a section, read at ``site`` (``vllm/...py:LINE``) in ``context``."""

    section: str
    field: str
    site: str
    context: str
    #: the value given, for a processor option (its ``repr``)
    value: str = ""


def section_of(config: object) -> str:
    """The section of a config object: the checkpoint's, by its ``model_type``, or ``derived
    CLASS`` for an object vLLM's code built (its class lives in vLLM)."""
    kind = type(config)
    if kind.__module__.startswith("vllm."):
        return f"derived {kind.__name__}"
    values = object.__getattribute__(config, "__dict__")
    model_type = values.get("model_type") or getattr(kind, "model_type", "")
    return SECTIONS.get(model_type, f"derived {kind.__name__}")


@dataclass
class ConfigReads:
    """Records reads of config fields from the watched files while installed (a context
    manager); ``context`` names what runs now (a check's node id, or a build)."""

    ignore: tuple[str, str] | None = None
    #: the default checkpoint's ``config.json`` content (what an ignored field reads as)
    default_config: Mapping[str, Any] = field(default_factory=dict)
    context: str = ""
    reads: set[FieldRead] = field(default_factory=set)
    _files: dict[str, str] = field(default_factory=dict)
    _saved: dict[str, Any] = field(default_factory=dict)
    _processor: tuple[Any, Any, Any] | None = None

    def __post_init__(self) -> None:
        if self.ignore is not None and self.ignore[0] not in CHECKPOINT_SECTIONS:
            raise ConfigReadsError(
                f"ignore: expected a field of one of {list(CHECKPOINT_SECTIONS)}, got section "
                f"{self.ignore[0]!r}"
            )
        for module in WATCHED_MODULES:
            try:
                path = installed_file(file_of(module))
            except VllmNotInstalled:
                continue
            self._files[str(path)] = str(file_of(module))

    def replacement(self, section: str) -> Any:
        """What the ignored field of ``section`` reads as: the default checkpoint's value, or
        :data:`ABSENT`."""
        assert self.ignore is not None
        return section_values(self.default_config, section).get(self.ignore[1], ABSENT)

    def watched_site(self, depth: int) -> str | None:
        """``file:line`` of the caller ``depth`` frames up when it is a watched file."""
        frame = sys._getframe(depth + 1)
        relative = self._files.get(frame.f_code.co_filename)
        return None if relative is None else f"{relative}:{frame.f_lineno}"

    def note(self, section: str, name: str, site: str, value: str = "") -> None:
        self.reads.add(FieldRead(section, name, site, self.context, value))

    def options(self, kwargs: dict[str, Any], what: str) -> dict[str, Any]:
        """The keyword options given to the processor (``what``: its constructor or a call),
        noted with their values; an ignored one left out (or, if required, set to its default
        variant's value)."""
        site = self.watched_site(2) or f"{file_of(PROCESSOR_MODULE)} ({what})"
        kept = dict(kwargs)
        for name, value in kwargs.items():
            if name in NOT_OPTIONS:
                continue
            self.note(OPTION_SECTION, name, site, repr(value))
            if self.ignores(OPTION_SECTION, name):
                if name in REQUIRED_OPTIONS:
                    kept[name] = REQUIRED_OPTIONS[name]
                else:
                    del kept[name]
        return kept

    def ignores(self, section: str, name: str) -> bool:
        return self.ignore == (section, name)

    def __enter__(self) -> ConfigReads:
        from transformers import PretrainedConfig

        recorder = self
        get_attribute = PretrainedConfig.__getattribute__
        to_dict = PretrainedConfig.to_dict
        self._saved = {"__getattribute__": get_attribute, "to_dict": to_dict}

        def recorded_getattribute(config: Any, name: str) -> Any:
            value = get_attribute(config, name)
            if name.startswith("__") or callable(value):  # a method, not a field
                return value
            site = recorder.watched_site(1)
            if site is None:
                return value
            section = section_of(config)
            recorder.note(section, name, site)
            if recorder.ignores(section, name):
                replaced = recorder.replacement(section)
                if replaced is ABSENT:
                    raise AttributeError(f"{name} (ignored: absent from the default checkpoint)")
                value = replaced
            if section == "vision_config" and name == "args" and isinstance(value, dict):
                return RecordedArgs(value, recorder)
            return value

        def recorded_to_dict(config: Any) -> dict[str, Any]:
            values: dict[str, Any] = to_dict(config)
            site = recorder.watched_site(1)
            if site is None:
                return values
            section = section_of(config)
            for name in list(values):
                recorder.note(section, name, f"{site} (to_dict)")
                if recorder.ignores(section, name):
                    replaced = recorder.replacement(section)
                    if replaced is ABSENT:
                        del values[name]
                    else:
                        values[name] = replaced
            return values

        PretrainedConfig.__getattribute__ = recorded_getattribute
        PretrainedConfig.to_dict = recorded_to_dict
        self._patch_processor()
        return self

    def _patch_processor(self) -> None:
        """Note the options vLLM gives its processor (when vLLM is installed)."""
        try:
            processor = importlib.import_module(PROCESSOR_MODULE).NanoNemotronVLProcessor
        except ImportError:
            return
        recorder = self
        init, call = processor.__init__, processor.__call__
        self._processor = (processor, init, call)

        def recorded_init(instance: Any, *args: Any, **kwargs: Any) -> None:
            init(instance, *args, **recorder.options(kwargs, "constructor"))

        def recorded_call(instance: Any, *args: Any, **kwargs: Any) -> Any:
            return call(instance, *args, **recorder.options(kwargs, "call"))

        processor.__init__ = recorded_init
        processor.__call__ = recorded_call

    def __exit__(self, *exc: object) -> None:
        from transformers import PretrainedConfig

        for name, value in self._saved.items():
            setattr(PretrainedConfig, name, value)
        self._saved = {}
        if self._processor is not None:
            processor, init, call = self._processor
            processor.__init__, processor.__call__ = init, call
            self._processor = None


class RecordedArgs(dict[str, Any]):
    """``vision_config.args`` as the watched files see it: a dict whose key reads (``[]``,
    ``get``, ``in``, iteration, ``**``) are recorded, and whose ignored key reads as the default
    checkpoint's."""

    def __init__(self, values: dict[str, Any], recorder: ConfigReads) -> None:
        super().__init__(values)
        self.recorder = recorder
        if recorder.ignore is not None and recorder.ignore[0] == ARGS_SECTION:
            replaced = recorder.replacement(ARGS_SECTION)
            if replaced is ABSENT:
                super().pop(recorder.ignore[1], None)
            else:
                super().__setitem__(recorder.ignore[1], replaced)

    def _note(self, key: object, how: str = "") -> None:
        site = self.recorder.watched_site(2)
        if site is not None and isinstance(key, str):
            self.recorder.note(ARGS_SECTION, key, site + how)

    def __getitem__(self, key: str) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self._note(key)
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        # Overridden, so that ``**args`` reads the keys through here, not dict's fast path.
        for key in list(super().keys()):
            self._note(key, " (every key)")
            yield key

    def keys(self) -> Any:
        for key in list(super().keys()):
            self._note(key, " (every key)")
        return super().keys()


# The pytest options -------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nemotron-vl")
    group.addoption(
        "--record-config-reads",
        default=None,
        metavar="PATH",
        help="record which config fields the model's vLLM files read, by which checks, as JSON",
    )
    group.addoption(
        "--ignore-config-field",
        default=None,
        metavar="SECTION.FIELD",
        help="every read of this checkpoint config field by the model's vLLM files sees the "
        "default variant's value (e.g. vision_config.video_temporal_patch_size)",
    )


def parse_field(text: str) -> tuple[str, str]:
    """``"SECTION.FIELD"`` -> ``(SECTION, FIELD)`` (``vision_config.args.KEY`` names a key of
    RADIO's arguments); a clear error naming the option otherwise."""
    for section in sorted(CHECKPOINT_SECTIONS, key=len, reverse=True):
        if text.startswith(section + ".") and len(text) > len(section) + 1:
            return section, text[len(section) + 1 :]
    raise pytest.UsageError(
        f"--ignore-config-field: expected SECTION.FIELD with SECTION one of "
        f"{list(CHECKPOINT_SECTIONS)}, got {text!r}"
    )


class RecordingSession:
    """The plugin while recording: a context per check and per build, the variants built."""

    def __init__(self, recorder: ConfigReads, out: Path | None) -> None:
        self.recorder = recorder
        self.out = out
        self.checks: list[str] = []
        self.builds: dict[str, int] = {}
        self.users: dict[int, set[str]] = {}
        self.variants: dict[ModelSpec, set[str]] = {}
        self.check = ""
        self.patch = pytest.MonkeyPatch()
        patch_builds(self.around_build, self.patch)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.check = self.recorder.context = nodeid
        self.checks.append(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.check = self.recorder.context = ""

    def around_build(self, key: str, spec: ModelSpec, build: Callable[[], Any]) -> Any:
        index = self.builds.setdefault(key, len(self.builds))
        self.variants.setdefault(spec.checkpoint, set())
        if self.check:
            self.users.setdefault(index, set()).add(self.check)
            self.variants[spec.checkpoint].add(self.check)
        outer = self.recorder.context
        self.recorder.context = f"{BUILD}{index}"
        try:
            return build()
        finally:
            self.recorder.context = outer

    def document(self) -> dict[str, Any]:
        """What was recorded: each field's sites and the checks that read it (a build's reads
        count for every check that used the build), and each variant built with its config."""
        fields: dict[tuple[str, str], dict[str, set[str]]] = {}
        values: dict[tuple[str, str], set[str]] = {}
        for read in self.recorder.reads:
            if read.value:
                values.setdefault((read.section, read.field), set()).add(read.value)
            if read.context.startswith(BUILD):
                checks = self.users.get(int(read.context.removeprefix(BUILD)), set())
            else:
                checks = {read.context} if read.context else {OUTSIDE_CHECKS}
            sites = fields.setdefault((read.section, read.field), {})
            sites.setdefault(read.site, set()).update(checks)
        return {
            "ignored": ".".join(self.recorder.ignore) if self.recorder.ignore else None,
            "checks": self.checks,
            "fields": [
                {
                    "section": section,
                    "field": name,
                    "sites": sorted(sites),
                    "checks": sorted(set().union(*sites.values())),
                    "values": sorted(values.get((section, name), ())),
                }
                for (section, name), sites in sorted(fields.items())
            ],
            "variants": [
                {
                    "slug": spec.slug,
                    "config": checkpoint_config(spec),
                    "checks": sorted(checks),
                }
                for spec, checks in sorted(self.variants.items(), key=lambda kv: kv[0].slug)
            ],
        }

    def finish(self) -> None:
        self.recorder.__exit__()
        self.patch.undo()
        if self.out is not None:
            replace_text(self.out, json.dumps(self.document(), indent=1) + "\n")


#: The context of a read made outside every check (collection, a session's set-up).
OUTSIDE_CHECKS = "(outside any check)"
BUILD = "build:"
_SESSION_KEY = pytest.StashKey[RecordingSession]()


def checkpoint_config(spec: ModelSpec) -> dict[str, Any]:
    """The ``config.json`` of ``spec``'s checkpoint folder, as written."""
    from harness.checkpoints.cache import checkpoint_folder

    document: dict[str, Any] = json.loads(
        (checkpoint_folder(spec.checkpoint) / "config.json").read_text()
    )
    return document


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--record-config-reads")
    ignored = config.getoption("--ignore-config-field")
    if out is None and ignored is None:
        return
    recorder = ConfigReads(
        ignore=parse_field(ignored) if ignored else None,
        default_config=checkpoint_config(ModelSpec()),
    )
    recorder.__enter__()
    session = RecordingSession(recorder, Path(out) if out else None)
    config.stash[_SESSION_KEY] = session
    config.pluginmanager.register(session, "nemotron-vl-config-reads")


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        session.finish()
