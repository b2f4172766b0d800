"""Our AST mutator: each operator on hand-written code, the rest of the file untouched, each
mutant's statement line, and a reproducible sample over every function in scope."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.mutation import ast_mutants
from harness.mutation.ast_mutants import (
    FunctionNotFound,
    candidates,
    enumerate_mutants,
    sample,
)
from harness.mutation.reach import functions_in_scope
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


def test_a_mutant_knows_the_first_line_of_its_statement():
    """coverage.py records statements, so a mutant inside a statement spanning lines is found
    by its statement's first line (here 2), whichever line the mutated node is on."""
    source = "def f(a):\n    return g(\n        a + 1,\n    )\n"
    [arithmetic] = [
        m for m in enumerate_mutants(source, FILE, "f").mutants if m.operator == "arithmetic"
    ]
    assert (arithmetic.line, arithmetic.statement_line) == (3, 2)


@pytest.fixture(scope="module")
def everything():
    """Every mutant of the installed vLLM's functions in scope (about 2 s to enumerate)."""
    return candidates()


@needs_vllm
def test_the_sample_is_reproducible_and_covers_every_function(everything):
    assert len(everything) >= 2000
    first = sample(everything, 600, 0)
    assert [m.id for m in first] == [m.id for m in sample(everything, 600, 0)]
    assert [m.id for m in first] != [m.id for m in sample(everything, 600, 1)]
    assert len(first) == 600
    with_mutants = {(m.file, m.qualname) for m in everything}
    assert {(m.file, m.qualname) for m in first} == with_mutants
    # Every function in scope with a body beyond its docstring has mutants.
    in_scope = {(f.file, f.qualname) for f in functions_in_scope()}
    assert with_mutants <= in_scope
    assert len(with_mutants) >= 0.8 * len(in_scope)


@needs_vllm
@pytest.mark.exhaustive
def test_a_mutant_parses_in_its_function_as_in_its_whole_file(everything, monkeypatch):
    """Enumeration parses each mutant's function text, not the whole file: the mutants kept,
    and the count of unparseable ones, are those a whole-file parse gives, for every function
    in scope of the installed vLLM (parsed whole here: about 20 s)."""

    def whole_file(source: str, *_: object) -> object:
        def parses(mutant: ast_mutants.AstMutant) -> bool:
            try:
                ast.parse(mutant.apply(source))
            except SyntaxError:
                return False
            return True

        return parses

    monkeypatch.setattr(ast_mutants, "_function_parser", whole_file)
    assert candidates() == everything


def test_an_indented_decorated_method_parses_in_its_function_text():
    """A method (indented, decorated, a string in it whose second line is not indented) is
    parsed under ``if 1:`` from its decorator on: its mutants are kept and each parses whole."""
    source = 'class C:\n    @staticmethod\n    def f(a):\n        return a + """x\ny"""\n'
    result = enumerate_mutants(source, FILE, "C.f")
    assert result.unparseable == 0
    assert [(m.operator, m.replacement) for m in result.mutants] == [
        ("statement-removed", "return None"),
        ("arithmetic", "-"),
    ]
    for mutant in result.mutants:
        ast.parse(mutant.apply(source))


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
    """A classification made against the installed vLLM release whose mutant is gone (the
    file changed under it) fails here. Classifications are per release: those made against
    another release (``classified_against``) are that release's, and the installed one's
    survivors are unclassified until the sweep classifies them against it."""
    from harness.release_environments import installed_release

    ids = {m.id for m in everything}
    installed = f"vllm {installed_release()},"
    ours = {key for key, c in load_survivors().items() if c.against.startswith(installed)}
    stale = sorted(ours - ids)
    assert stale == [], f"classified survivors that are no longer mutants: {stale}"


def test_a_malformed_survivor_file_is_named(tmp_path):
    path = tmp_path / "survivors.toml"
    path.write_text("[[survivor]]\nid = 'x'\nverdict = 'maybe'\nreason = 'r'\n")
    with pytest.raises(SurvivorFileError, match="expected one of \\('equivalent', 'gpu-only'\\)"):
        load_survivors(path)
