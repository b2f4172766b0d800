"""The regression corpus: every upstream fix to the model, as a mutant and the checks it fails.

``fixtures/corpus.toml`` holds one record per bug class the model's history fixed upstream::

    [[record]]
    id = "tensor-truthiness"                  # a short name for the class
    upstream = ["#56398"]                     # the vLLM pull requests that fixed it
    class = "tensor truthiness"
    what = "one sentence: what went wrong"
    files = ["vllm/model_executor/models/nano_nemotron_vl.py"]  # the files the fix touched
    gpu_only = "why it can only show on a GPU"  # optional: such a class runs in the GPU script

    [[record.mutant]]                         # the bug put back, on one target kind
    kind = "vllm-file"                        # or "reference-mutant"
    name = "image-embeds-walrus-truthiness"   # mutation.file_mutants / targets.reference.mutant
    suites = ["suites/conformance/test_passthrough.py"]  # files or checks it runs against
    xpass = []                                # known deviations it happens to fix
    [record.mutant.fails]                     # exactly the checks it fails, each with a
    "suites/...::test_x[param]" = "Boolean value of Tensor"  # substring of the failure's reason

A meta-test (``suites/harness/test_corpus.py``) runs each mutant and pins exactly those failures;
the kill matrix (:mod:`harness.mutation.matrix`) runs each against the whole suites.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import ROOT

CORPUS_FILE = ROOT / "fixtures" / "corpus.toml"
MUTANT_KINDS = ("vllm-file", "reference-mutant")


class CorpusError(ValueError):
    """The corpus file is malformed; the message names the record and the field."""


@dataclass(frozen=True)
class CorpusMutant:
    record: str  # the record's id
    kind: str  # one of MUTANT_KINDS
    name: str
    suites: tuple[str, ...]
    fails: dict[str, str]  # check id -> a substring of its failure's reason
    xpass: frozenset[str]

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Record:
    id: str
    upstream: tuple[str, ...]
    bug_class: str
    what: str
    files: tuple[str, ...]
    mutants: tuple[CorpusMutant, ...]
    gpu_only: str | None = None


def _field(entry: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in entry:
        raise CorpusError(f"{where}: field {key!r} is missing")
    value = entry[key]
    if not isinstance(value, kind):
        raise CorpusError(
            f"{where}: field {key!r}: expected {kind.__name__}, got {type(value).__name__} "
            f"{value!r}"
        )
    return value


def _strings(entry: dict[str, Any], key: str, where: str, *, empty: bool = False) -> list[str]:
    values = _field(entry, key, list, where)
    if not empty and not values:
        raise CorpusError(f"{where}: field {key!r}: expected at least one entry, got []")
    for value in values:
        if not isinstance(value, str) or not value:
            raise CorpusError(f"{where}: field {key!r}: expected non-empty strings, got {value!r}")
    return list(values)


def _mutant(record: str, entry: dict[str, Any], where: str) -> CorpusMutant:
    kind = _field(entry, "kind", str, where)
    if kind not in MUTANT_KINDS:
        raise CorpusError(f"{where}: field 'kind': expected one of {MUTANT_KINDS}, got {kind!r}")
    fails = _field(entry, "fails", dict, where)
    if not fails:
        raise CorpusError(f"{where}: field 'fails': expected the checks it fails, got none")
    for check, reason in fails.items():
        if "::" not in check or not isinstance(reason, str) or not reason:
            raise CorpusError(
                f"{where}: field 'fails': expected 'suites/...::check' = 'reason substring', "
                f"got {check!r} = {reason!r}"
            )
    return CorpusMutant(
        record=record,
        kind=kind,
        name=_field(entry, "name", str, where),
        suites=tuple(_strings(entry, "suites", where)),
        fails=dict(fails),
        xpass=frozenset(_strings(entry, "xpass", where, empty=True) if "xpass" in entry else []),
    )


def load_corpus(path: Path = CORPUS_FILE) -> tuple[Record, ...]:
    """Every record of the corpus file, validated (:class:`CorpusError` names what is wrong)."""
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise CorpusError(f"{path}: cannot read the corpus: {e}") from e
    records: list[Record] = []
    seen_ids: set[str] = set()
    seen_mutants: set[str] = set()
    for index, entry in enumerate(document.get("record", [])):
        where = f"{path.name}: record {index}"
        record_id = _field(entry, "id", str, where)
        where = f"{path.name}: record {record_id!r}"
        if record_id in seen_ids:
            raise CorpusError(f"{where}: the id is used twice")
        seen_ids.add(record_id)
        upstream = tuple(_strings(entry, "upstream", where, empty=True))
        bug_class = _field(entry, "class", str, where)
        what = _field(entry, "what", str, where)
        files = tuple(_strings(entry, "files", where))
        gpu_only = entry.get("gpu_only")
        if gpu_only is not None and not isinstance(gpu_only, str):
            raise CorpusError(f"{where}: field 'gpu_only': expected a reason, got {gpu_only!r}")
        mutants = tuple(
            _mutant(record_id, m, f"{where}, mutant {i}")
            for i, m in enumerate(_field(entry, "mutant", list, where))
        )
        for mutant in mutants:
            if mutant.key in seen_mutants:
                raise CorpusError(f"{where}: mutant {mutant.key} is in another record too")
            seen_mutants.add(mutant.key)
        records.append(
            Record(
                id=record_id,
                upstream=upstream,
                bug_class=bug_class,
                what=what,
                files=files,
                mutants=mutants,
                gpu_only=gpu_only,
            )
        )
    if not records:
        raise CorpusError(f"{path}: expected [[record]] tables, found none")
    return tuple(records)


def corpus_mutants(records: tuple[Record, ...]) -> list[CorpusMutant]:
    return [m for r in records for m in r.mutants]
