"""Shards of a sweep: ``--shard K/N`` runs every N-th item of the kill matrix or the mutation
sample, starting at the K-th, so that N machines (a CI matrix) or N processes share it; a merge
puts the shards' results back into the one report an unsharded run writes.

Items are dealt round-robin in their unsharded order, so each shard gets a like mix (the corpus
in its record order, the mutation sample in its seeded order) and no shard waits on a run of one
file's slow mutants.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_SHARD = re.compile(r"^(\d+)/(\d+)$")


class ShardError(ValueError):
    """A shard spec or a set of shard results that cannot be used; the message names it."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def select(self, items: Sequence[T]) -> list[T]:
        """This shard's items: every ``count``-th, from the ``index``-th."""
        return list(items[self.index - 1 :: self.count])


#: The whole sweep, as one shard.
WHOLE = Shard(1, 1)


def parse_shard(text: str) -> Shard:
    """``K/N`` with ``1 <= K <= N``."""
    match = _SHARD.match(text.strip())
    if match is None:
        raise ShardError(f"--shard: expected K/N (e.g. 2/4), got {text!r}")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard: expected 1 <= K <= N, got {text!r}")
    return Shard(index, count)


def check_complete(shards: Sequence[str], where: Sequence[str]) -> int:
    """The shard count of results ``where`` (file names) that say they are shards ``shards``
    (``K/N`` each): every shard of one ``N`` exactly once, else :class:`ShardError` naming
    what is missing, repeated or mixed."""
    parsed = [parse_shard(s) for s in shards]
    counts = {s.count for s in parsed}
    if len(counts) != 1:
        raise ShardError(
            "merge: expected shards of one sweep (one N), got "
            + ", ".join(f"{w}: {s}" for w, s in zip(where, shards, strict=True))
        )
    count = counts.pop()
    seen: dict[int, str] = {}
    for shard, name in zip(parsed, where, strict=True):
        if shard.index in seen:
            raise ShardError(f"merge: shard {shard} given twice: {seen[shard.index]} and {name}")
        seen[shard.index] = name
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise ShardError(
            f"merge: expected all {count} shards, missing "
            + ", ".join(f"{i}/{count}" for i in missing)
        )
    return count


def add_shard_options(
    parser: argparse.ArgumentParser, items: str, merged: str, metavar: str
) -> None:
    """``--shard K/N`` (every N-th of ``items`` from the K-th) and ``--merge FILE ...`` (the
    shards' ``merged`` files, put back together instead of running) on a sweep's command."""
    parser.add_argument(
        "--shard",
        type=_shard_argument,
        default=WHOLE,
        help=f"run every N-th {items} from the K-th: K/N (default 1/1)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar=metavar,
        help=f"the shards' {merged}: write the one report of the whole sweep from them",
    )


def _shard_argument(text: str) -> Shard:
    try:
        return parse_shard(text)
    except ShardError as e:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(e).removeprefix("--shard: ")) from None
