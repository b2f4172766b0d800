"""The project's TOML fixtures (known deviations, unreached lines, config-field reasons): arrays
of tables whose keys are fixed strings, read with errors that name the file, the entry and the
key."""

from __future__ import annotations

import tomllib
from pathlib import Path


def string_tables(
    path: Path,
    table: str,
    keys: frozenset[str],
    error: type[ValueError],
    optional: frozenset[str] = frozenset(),
) -> list[tuple[str, dict[str, str]]]:
    """Each ``[[table]]`` of ``path`` as ``(where, entry)``: ``where`` names the entry
    (``"PATH: table #N"``) for the caller's own checks, ``entry`` has exactly ``keys`` and any of
    ``optional``, each a string. A file that is not TOML, holds anything but ``[[table]]`` or
    an entry of other keys or values raises ``error`` saying which."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not valid TOML: {e}") from e
    if set(data) - {table}:
        raise error(f"{path}: expected only [[{table}]] tables, got {sorted(set(data))}")
    entries = []
    for i, entry in enumerate(data.get(table, [])):
        where = f"{path}: {table} #{i + 1}"
        if not isinstance(entry, dict) or not keys <= set(entry) <= keys | optional:
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            expected = f"the keys {sorted(keys)}" + (
                f" and any of {sorted(optional)}" if optional else ""
            )
            raise error(f"{where}: expected {expected}, got {got}")
        wrong = sorted(k for k in entry if not isinstance(entry[k], str))
        if wrong:
            raise error(f"{where}: {', '.join(wrong)}: every value must be a string")
        entries.append((where, entry))
    return entries
