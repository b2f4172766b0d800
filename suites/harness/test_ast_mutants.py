"""Our AST mutator: each operator on hand-written code, the rest of the file untouched, the
covered functions present in the installed vLLM, and a reproducible sample."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.model_files import installed_file
from harness.mutation.ast_mutants import (
    COVERED,
    FunctionNotFound,
    candidates,
    enumerate_mutants,
    find_function,
    sample,
)
from harness.mutation.score import SurvivorFileError, load_survivors, wilson_interval
from suites.harness.helpers import needs_vllm

FILE = Path("vllm/example.py")
SOURCE = '''"""Module docstring."""
import logging

logger = logging.getLogger(__name__)


class Tiler:
    def count(self, width: int, height: int = 2) -> int:
        """Docstring: never mutated."""
        logger.info("count %d", width + 1)
        if width < height and not self.flat:
            raise ValueError(f"width {width + 1}")
        total = width * height
        total += 1
        assert total > 0, "positive"
        return total
'''


def mutated(operator: str) -> list[str]:
    """The mutated lines of each ``operator`` mutant of ``Tiler.count``."""
    result = enumerate_mutants(SOURCE, FILE, "Tiler.count")
    lines = SOURCE.splitlines()
    out = []
    for mutant in result.mutants:
        if mutant.operator == operator:
            new = mutant.apply(SOURCE).splitlines()
            out += [b for a, b in zip(lines, new, strict=True) if a != b]
    return out


def test_arithmetic():
    assert mutated("arithmetic") == ["        total = width / height"]


def test_comparison():
    assert mutated("comparison") == [
        "        if width <= height and not self.flat:",
        '        assert total >= 0, "positive"',
    ]


def test_boolean_and_not():
    assert mutated("boolean") == ["        if width < height or not self.flat:"]
    assert mutated("not-removed") == ["        if width < height and self.flat:"]


def test_constants():
    assert mutated("constant") == [
        "        total += 2",
        "        total += 0",
        '        assert total > 1, "positive"',
    ]


def test_condition_negated():
    assert mutated("condition-negated") == ["        if not (width < height and not self.flat):"]


def test_statements_removed():
    assert mutated("statement-removed") == [
        "            pass",
        "        pass",
        "        pass",
        "        return None",
    ]


def test_docstrings_annotations_fstrings_logging_and_assert_messages_are_left_alone():
    for mutant in enumerate_mutants(SOURCE, FILE, "Tiler.count").mutants:
        assert mutant.line not in (8, 9, 10), mutant.description  # signature, docstring, logger
        if mutant.line == 12:  # the raise: removed whole, nothing inside its f-string mutated
            assert mutant.operator == "statement-removed", mutant.description
        assert "positive" not in mutant.original, mutant.description


def test_a_mutant_changes_only_its_span():
    for mutant in enumerate_mutants(SOURCE, FILE, "Tiler.count").mutants:
        text = mutant.apply(SOURCE)
        assert text[: mutant.start] == SOURCE[: mutant.start]
        assert text[mutant.start + len(mutant.replacement) :] == SOURCE[mutant.end :]
        ast.parse(text)


def test_nested_functions_are_mutated_with_their_enclosing_one():
    """vLLM builds its prompt replacements as closures (get_image_replacement inside
    _get_prompt_repl_image): their bodies belong to the covered function."""
    source = "def outer(n):\n    def inner(i):\n        return i - n\n    return inner\n"
    result = enumerate_mutants(source, FILE, "outer")
    assert result.unparseable == 0
    assert [(m.line, m.operator, m.replacement) for m in result.mutants] == [
        (3, "statement-removed", "return None"),
        (3, "arithmetic", "+"),
        (4, "statement-removed", "return None"),
    ]


def test_an_unknown_function_is_named():
    with pytest.raises(FunctionNotFound, match=r"Tiler\.size: no such function"):
        enumerate_mutants(SOURCE, FILE, "Tiler.size")


def test_a_changed_file_is_refused():
    mutant = enumerate_mutants(SOURCE, FILE, "Tiler.count").mutants[0]
    with pytest.raises(ValueError, match="the file's text at its span changed"):
        mutant.apply(SOURCE.replace("width", "w"))


@needs_vllm
def test_every_covered_function_is_in_the_installed_vllm():
    """A covered function renamed or removed upstream fails here: the list must follow."""
    sources: dict[Path, ast.Module] = {}
    for covered in COVERED:
        if covered.file not in sources:
            sources[covered.file] = ast.parse(installed_file(covered.file).read_text())
        find_function(sources[covered.file], covered.qualname)
        for suite in covered.suites:
            assert (Path(__file__).parents[2] / suite).is_file(), suite


@pytest.fixture(scope="module")
def everything():
    """Every mutant of the installed vLLM's covered functions (about 10 s to enumerate)."""
    return candidates()


@needs_vllm
def test_the_sample_is_reproducible_and_covers_every_function(everything):
    assert len(everything) >= 300
    first = sample(everything, 300, 0)
    assert [m.id for m in first] == [m.id for m in sample(everything, 300, 0)]
    assert [m.id for m in first] != [m.id for m in sample(everything, 300, 1)]
    assert len(first) == 300
    assert {(m.file, m.qualname) for m in first} == {(c.file, c.qualname) for c in COVERED}


@pytest.mark.parametrize(
    ("killed", "total", "low", "high"),
    # Wilson 95% intervals computed by hand: p = 0.9, n = 100 -> 0.8256 to 0.9448.
    [(90, 100, 0.8256, 0.9448), (0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0)],
)
def test_wilson_interval(killed, total, low, high):
    got = wilson_interval(killed, total)
    assert got == pytest.approx((low, high), abs=1e-4)


@needs_vllm
def test_every_classified_survivor_is_a_mutant_of_the_installed_vllm(everything):
    """A classification left behind by a vLLM upgrade (its mutant gone) fails here."""
    ids = {m.id for m in everything}
    stale = sorted(set(load_survivors()) - ids)
    assert stale == [], f"classified survivors that are no longer mutants: {stale}"


def test_a_malformed_survivor_file_is_named(tmp_path):
    path = tmp_path / "survivors.toml"
    path.write_text("[[survivor]]\nid = 'x'\nverdict = 'maybe'\nreason = 'r'\n")
    with pytest.raises(SurvivorFileError, match="expected one of \\('equivalent', 'gpu-only'\\)"):
        load_survivors(path)
