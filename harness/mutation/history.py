"""The order a mutant's checks run in: those that killed its neighbours in an earlier sweep first.

A mutant's run stops at its first failing check (``-x``), so a killed mutant costs the checks that
run before its killer, and a survivor costs all of them whatever their order. The checks that kill
mutants cluster: one weight-loading check killed 43 of ``load_weights``'s mutants, one routing check
42 of the parser's (measured on a 2-core machine, on every 20th mutant of the sample: its killed
mutants' runs took 66.9 s ordered quickest first, 56.8 s in this order). As test prioritisation by
failure history does, the checks a mutant can reach run in this order: those that killed other
mutants of its line in the earlier sweep, most kills first; then those that killed others in its
function; then anywhere in scope; the quickest first among equals (the order they come in).

A mutant's own record in the history is left out: a mutant runs again only in a fresh sweep, and
it is then ordered as one never run, so a sweep's speed measured with the history of the same
sample is what a new sample would see. The history is fixed for the whole sweep (read once, never
updated as mutants end), so every shard of a sweep orders alike; what depends on the order is
only which failing check a killed mutant names, never whether it is killed.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.mutation.ast_mutants import AstMutant


class HistoryError(ValueError):
    """A history file that cannot be used; the message names the file and the field."""


Kill = tuple[str, str, str, int, str]  # mutant id, file, function, line, the check that killed it


@dataclass(frozen=True)
class KillHistory:
    """Which checks killed which mutants in an earlier sweep, counted by where the mutants are."""

    #: the kills, sorted (:meth:`of_kills`); the counts below are derived from them
    kills: tuple[Kill, ...] = ()
    by_line: dict[tuple[str, int], Counter[str]] = field(init=False, compare=False)
    by_function: dict[tuple[str, str], Counter[str]] = field(init=False, compare=False)
    overall: Counter[str] = field(init=False, compare=False)
    #: each mutant's own killers, left out when it is ordered
    killers_of: dict[str, Counter[str]] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        by_line: dict[tuple[str, int], Counter[str]] = {}
        by_function: dict[tuple[str, str], Counter[str]] = {}
        killers_of: dict[str, Counter[str]] = {}
        for mutant_id, file, function, line, check in self.kills:
            by_line.setdefault((file, line), Counter())[check] += 1
            by_function.setdefault((file, function), Counter())[check] += 1
            killers_of.setdefault(mutant_id, Counter())[check] += 1
        overall = Counter(kill[4] for kill in self.kills)
        for name, value in (
            ("by_line", by_line),
            ("by_function", by_function),
            ("overall", overall),
            ("killers_of", killers_of),
        ):
            object.__setattr__(self, name, value)

    @property
    def digest(self) -> str:
        """A digest of the kills, the same for every shard of a sweep ("": no history)."""
        if not self.kills:
            return ""
        return hashlib.sha256(json.dumps(self.kills).encode()).hexdigest()[:12]

    @classmethod
    def from_report(cls, report: Mapping[str, Any], source: str = "report") -> KillHistory:
        """The kills a mutation report records (``mutants[].killed_by``, the recheck's too)."""
        rows = report.get("mutants", [])
        if not isinstance(rows, list):
            raise HistoryError(
                f"{source}: mutants: expected a list of mutant rows, got {type(rows).__name__}"
            )
        kills: list[Kill] = []
        for number, row in enumerate(rows):
            if not isinstance(row, dict):
                raise HistoryError(
                    f"{source}: mutants[{number}]: expected an object, got {type(row).__name__}"
                )
            for name, kind in (("id", str), ("file", str), ("function", str), ("line", int)):
                if not isinstance(row.get(name), kind):
                    raise HistoryError(
                        f"{source}: mutants[{number}].{name}: expected {kind.__name__}, got "
                        f"{row.get(name)!r}"
                    )
            killers = [*_killers(row), *_killers(row.get("recheck") or {})]
            for check in killers:
                kills.append((row["id"], row["file"], row["function"], row["line"], check))
        return cls.of_kills(kills)

    @classmethod
    def of_kills(cls, kills: Sequence[Sequence[Any]]) -> KillHistory:
        """The history of ``kills``: (mutant id, file, function, line, check) each."""
        return cls(
            tuple(
                sorted(
                    (str(m), str(file), str(function), int(line), str(check))
                    for m, file, function, line, check in kills
                )
            )
        )

    def to_json(self) -> dict[str, Any]:
        """What a runs file keeps of it, so that a resumed sweep orders as it began."""
        return {"digest": self.digest, "kills": [list(kill) for kill in self.kills]}

    @classmethod
    def from_json(cls, document: Mapping[str, Any], source: str) -> KillHistory:
        kills = document.get("kills")
        if not isinstance(kills, list) or not all(
            isinstance(k, list) and len(k) == 5 and isinstance(k[3], int) for k in kills
        ):
            raise HistoryError(
                f"{source}: history.kills: expected a list of [mutant, file, function, line, "
                f"check] rows, got {str(kills)[:80]}"
            )
        history = cls.of_kills(kills)
        if history.digest != document.get("digest"):
            raise HistoryError(
                f"{source}: history.digest: expected {history.digest} (of its kills), got "
                f"{document.get('digest')!r}"
            )
        return history

    @classmethod
    def read(cls, path: Path) -> KillHistory:
        """The history in the mutation report at ``path``; none when there is no such file."""
        if not path.is_file():
            return cls()
        try:
            report = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise HistoryError(f"{path}: cannot read the mutation report: {e}") from e
        if not isinstance(report, dict):
            raise HistoryError(f"{path}: expected a mutation report object")
        return cls.from_report(report, str(path))

    def order(self, mutant: AstMutant, checks: Sequence[str]) -> list[str]:
        """``checks`` (quickest first) in the order to run them against ``mutant``."""
        own = self.killers_of.get(mutant.id, Counter())
        file = str(mutant.file)
        levels = (
            self.by_line.get((file, mutant.line), Counter()),
            self.by_function.get((file, mutant.qualname), Counter()),
            self.overall,
        )

        def rank(indexed: tuple[int, str]) -> tuple[int, ...]:
            index, check = indexed
            return (*(own[check] - level[check] for level in levels), index)

        return [check for _, check in sorted(enumerate(checks), key=rank)]


def _killers(row: Mapping[str, Any]) -> list[str]:
    """The checks that killed a row's mutant (its first, with ``-x``)."""
    if not str(row.get("status", "")).startswith("killed"):
        return []
    killed_by = row.get("killed_by") or []
    return [check for check in killed_by if isinstance(check, str)]
