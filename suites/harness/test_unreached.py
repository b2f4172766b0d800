"""Why no check executes a line: the entries of ``fixtures/unreached.toml``, read and joined with
a reach map (a hand-made one: which lines are unreached is the map's, not these tests')."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.mutation.reach import functions_in_scope
from harness.mutation.unreached import (
    REASONS,
    UNREACHED_FILE,
    Explanation,
    UnreachedFileError,
    explain,
    load_explanations,
    parse_lines,
    report_lines,
)
from suites.harness.helpers import needs_vllm

F = "vllm/x.py:Model.forward"
G = "vllm/x.py:Model.other"


def test_line_ranges_are_read():
    assert parse_lines("3-5, 9", "here") == {3, 4, 5, 9}
    assert parse_lines(" 7 ", "here") == {7}
    with pytest.raises(UnreachedFileError, match=r"here: lines: expected ranges .*'3-x'"):
        parse_lines("3-x", "here")
    with pytest.raises(UnreachedFileError, match=r"here: lines: a range ends before it starts"):
        parse_lines("9-3", "here")


def test_each_unreached_line_gets_its_entry_s_reason_and_the_rest_are_unexplained():
    entries = [
        Explanation(F, frozenset({10, 11, 12}), "gpu", "the forward pass"),
        Explanation(F, frozenset({40}), "dead", "no caller"),  # line 40: a check reaches it now
        Explanation(G, frozenset({5}), "engine", "profiling"),
    ]
    report = explain([(F, [10, 11, 12, 20]), (G, [5])], entries)
    forward, other = report.functions
    assert forward.explained == [([10, 11, 12], "gpu", "the forward pass")]
    assert forward.unexplained == [20]
    assert other.explained == [([5], "engine", "profiling")]
    assert report.stale == [(F, [40])]
    assert report.counts() == {"gpu": 3, "engine": 1, "unexplained": 1}
    text = "\n".join(report_lines(report.to_json()))
    assert f"| `{F}` | 20 | **unexplained** | needs a reason or a check |" in text
    assert f"| `{F}` | 10-12 | gpu | the forward pass |" in text
    assert f"- `{F}`: 40" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[unreached]]\nfunction = "f"\nlines = "1"\nreason = "gpu"\nwhy = "w"\n', "FILE:Qual"),
        (
            '[[unreached]]\nfunction = "a.py:f"\nlines = "1"\nreason = "lazy"\nwhy = "w"\n',
            r"reason: expected one of \['dead', 'defensive', 'engine', 'gpu', 'input', "
            r"'option'\], got 'lazy'",
        ),
        ('[[unreached]]\nfunction = "a.py:f"\nlines = "1"\n', r"expected the keys"),
        ("[other]\n", r"expected only \[\[unreached\]\] tables"),
    ],
)
def test_a_malformed_file_is_named(tmp_path: Path, text: str, message: str):
    path = tmp_path / "unreached.toml"
    path.write_text(text)
    with pytest.raises(UnreachedFileError, match=message):
        load_explanations(path)


@needs_vllm
def test_the_committed_entries_name_lines_of_functions_in_the_scope():
    """Every entry for the installed release names a function of the score's scope (found in
    the installed files by their syntax tree) and lines inside its body, for a reason of
    REASONS. Entries for other releases are those releases' (their line numbers are their
    files'): the installed release may have none yet, and the reach report then shows its
    unreached lines unexplained."""
    assert load_explanations(UNREACHED_FILE, None), f"{UNREACHED_FILE} has no entries"
    entries = load_explanations(UNREACHED_FILE)
    functions = {f.name: f for f in functions_in_scope()}
    for entry in entries:
        assert entry.function in functions, f"{entry.function}: not a function of the scope"
        function = functions[entry.function]
        outside = sorted(
            line for line in entry.lines if not function.first_line <= line <= function.last_line
        )
        assert not outside, f"{entry.function}: lines {outside} outside its body"
        assert entry.reason in REASONS
        assert entry.why, f"{entry.function}: no why"


def test_an_entry_applies_to_the_releases_it_names(tmp_path):
    path = tmp_path / "unreached.toml"
    path.write_text(
        '[[unreached]]\nfunction = "f.py:g"\nlines = "3"\nreason = "dead"\nwhy = "w"\n'
        'releases = "<0.34.0"\n'
        '[[unreached]]\nfunction = "f.py:g"\nlines = "5"\nreason = "dead"\nwhy = "w"\n'
        'releases = ">=0.34.0"\n'
    )
    assert [sorted(e.lines) for e in load_explanations(path, "0.33.0")] == [[3]]
    assert [sorted(e.lines) for e in load_explanations(path, "0.34.0")] == [[5]]
    assert len(load_explanations(path, None)) == 2
    path.write_text(
        '[[unreached]]\nfunction = "f.py:g"\nlines = "3"\nreason = "dead"\nwhy = "w"\n'
        'releases = "0.34"\n'
    )
    with pytest.raises(UnreachedFileError, match="releases: expected '<X' or '>=X'"):
        load_explanations(path, None)
