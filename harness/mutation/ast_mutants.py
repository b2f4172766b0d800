"""First-order mutants of named functions of vLLM's model files, from their syntax trees.

:data:`COVERED` lists, by name, the functions the conformance suites claim to cover and the
suites that cover each. :func:`enumerate_mutants` walks one function's body and makes one mutant
per applicable operator and site; each replaces exactly the source span of one node, so the rest
of the file stays byte for byte what is installed. The operators (named as in mutmut and
cosmic-ray):

- ``arithmetic``: ``+`` and ``-`` swapped, ``*`` and ``/`` swapped, ``//`` and ``%`` to ``*``;
- ``comparison``: ``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``, ``is`` and ``is not``,
  ``in`` and ``not in`` swapped;
- ``boolean``: ``and`` and ``or`` swapped;
- ``not-removed``: ``not x`` becomes ``x``;
- ``constant``: an integer ``n`` becomes ``n + 1`` and, when not 0, ``0``; ``True`` and
  ``False`` swapped;
- ``condition-negated``: the test of an ``if``, ``while`` or conditional expression becomes
  ``not (test)``;
- ``statement-removed``: a call statement, an augmented assignment, an assignment or a
  ``raise`` becomes ``pass``; ``return x`` becomes ``return None``.

Skipped as trivially equivalent or meaningless: docstrings, annotations, the insides of
f-strings, ``assert`` messages and logging calls. A mutant whose text does not parse is dropped
and counted. :func:`sample` draws a seeded sample stratified by function.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.model_files import (
    MODEL_FILE,
    PARAKEET_FILE,
    PROCESSOR_FILE,
    RADIO_FILE,
    installed_file,
    write_mutated_copy,
)

_C = "suites/conformance/"
#: The suites covering each concern, the quickest first (a mutant's run stops at its first
#: failing check).
SUITES_OF_CONCERN: dict[str, tuple[str, ...]] = {
    "parsing": (f"{_C}test_contracts.py", f"{_C}test_passthrough.py", f"{_C}test_routing.py"),
    "embedding": (
        f"{_C}test_passthrough.py",
        f"{_C}test_routing.py",
        f"{_C}test_parity.py",
        f"{_C}test_requests.py",
    ),
    "processor": (
        f"{_C}test_processor_counts.py",
        f"{_C}test_metadata.py",
        f"{_C}test_requests.py",
        f"{_C}test_parity.py",
    ),
    "metadata": (f"{_C}test_metadata.py", f"{_C}test_configs.py", f"{_C}test_processor_counts.py"),
    "weights": (f"{_C}test_weight_loading.py",),
}


@dataclass(frozen=True)
class CoveredFunction:
    file: Path  # relative to site-packages
    qualname: str  # "Class.method" or "function"
    concern: str  # a key of SUITES_OF_CONCERN

    @property
    def suites(self) -> tuple[str, ...]:
        return SUITES_OF_CONCERN[self.concern]


def _covered(file: Path, concern: str, *names: str) -> list[CoveredFunction]:
    return [CoveredFunction(file, name, concern) for name in names]


VL = "NemotronH_Nano_VL_V2."
INFO = "NanoNemotronVLProcessingInfo."
MM = "NanoNemotronVLMultiModalProcessor."
COVERED: tuple[CoveredFunction, ...] = (
    *_covered(
        MODEL_FILE,
        "parsing",
        f"{VL}_parse_and_validate_image_input",
        f"{VL}_parse_and_validate_video_input",
        f"{VL}_parse_and_validate_multimodal_inputs",
    ),
    *_covered(
        MODEL_FILE,
        "embedding",
        f"{VL}embed_multimodal",
        f"{VL}_process_image_input",
        f"{VL}_process_image_input_dynamic",
        f"{VL}_process_video_input",
        f"{VL}_process_audio_input",
        f"{VL}_create_final_video_embeddings",
        f"{VL}_extract_video_embeddings_temporal",
        f"{VL}pixel_shuffle",
        f"{VL}pixel_shuffle_dynamic_res",
        f"{VL}extract_feature",
        f"{VL}extract_feature_dynamic",
    ),
    *_covered(
        MODEL_FILE,
        "processor",
        f"{MM}_get_hf_mm_inputs",
        f"{MM}_get_image_fields_config",
        f"{MM}_get_video_fields_config",
        f"{MM}_get_audio_fields_config",
        f"{MM}_get_mm_fields_config",
        f"{MM}_get_prompt_repl_image",
        f"{MM}_get_prompt_repl_video",
        f"{MM}_get_prompt_repl_audio",
        f"{MM}_get_prompt_updates",
    ),
    *_covered(
        MODEL_FILE,
        "metadata",
        f"{INFO}get_supported_mm_limits",
        f"{INFO}get_image_size_with_most_features",
        f"{INFO}get_max_image_tokens",
        f"{INFO}get_num_frames_with_most_features",
        f"{INFO}get_mm_max_tokens_per_item",
        f"{VL}get_mamba_state_shape_from_config",
        f"{VL}get_mamba_state_dtype_from_config",
    ),
    *_covered(MODEL_FILE, "weights", f"{VL}load_weights"),
    *_covered(
        PROCESSOR_FILE,
        "processor",
        "dynamic_preprocess",
        "BaseNanoNemotronVLProcessor.get_num_image_tokens",
        "BaseNanoNemotronVLProcessor._preprocess_image",
        "NanoNemotronVLProcessor.num_video_token",
        "NanoNemotronVLProcessor.get_image_repl",
        "NanoNemotronVLProcessor.get_audio_repl",
        "NanoNemotronVLProcessor.get_video_repl",
        "NanoNemotronVLProcessor._preprocess_audio",
        "NanoNemotronVLProcessor.__call__",
        "DynamicResolutionImageTiler._get_num_embeddings",
        "DynamicResolutionImageTiler.width_and_height_for_max_num_tokens_available",
        "DynamicResolutionImageTiler.compute_params",
    ),
    *_covered(
        PARAKEET_FILE,
        "processor",
        "ParakeetExtractor._clip_sizes",
        "ParakeetExtractor.audio_token_count",
        "ParakeetExtractor.split_audio_into_clips",
    ),
    *_covered(
        PARAKEET_FILE,
        "weights",
        "ProjectedParakeet.load_weights",
        "ProjectedParakeet._can_skip_missing_named_param",
    ),
    *_covered(RADIO_FILE, "weights", "RadioModel.load_weights"),
)


class FunctionNotFound(LookupError):
    """A covered function is not in the installed file (renamed or removed upstream)."""


@dataclass(frozen=True)
class AstMutant:
    """One first-order mutant: the span ``[start, end)`` of the file's text replaced."""

    file: Path
    qualname: str
    line: int
    col: int
    operator: str
    index: int  # among the mutants of one operator at one site
    start: int
    end: int
    replacement: str
    original: str

    @property
    def id(self) -> str:
        where = f"{self.file.parent.name}/{self.file.stem}:{self.qualname}"
        return f"{where}:{self.line}:{self.col}:{self.operator}:{self.index}"

    @property
    def description(self) -> str:
        before = " ".join(self.original.split())[:60]
        after = " ".join(self.replacement.split())[:60]
        return f"line {self.line}: `{before}` -> `{after}` ({self.operator})"

    def apply(self, source: str) -> str:
        if source[self.start : self.end] != self.original:
            raise ValueError(f"mutant {self.id}: the file's text at its span changed")
        return source[: self.start] + self.replacement + source[self.end :]


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    body: list[ast.stmt] = tree.body
    parts = qualname.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        for node in body:
            if last and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.name == part:
                    return node
            elif not last and isinstance(node, ast.ClassDef) and node.name == part:
                body = node.body
                break
        else:
            break
    raise FunctionNotFound(f"{qualname}: no such function")


class _Offsets:
    """Character offsets of ``ast`` positions (whose columns count UTF-8 bytes)."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col_bytes: int) -> int:
        text = self.lines[line - 1]
        return self.starts[line - 1] + len(text.encode()[:col_bytes].decode(errors="ignore"))

    def span(self, node: ast.expr | ast.stmt) -> tuple[int, int]:
        end_line = node.end_lineno if node.end_lineno is not None else node.lineno
        end_col = node.end_col_offset if node.end_col_offset is not None else node.col_offset
        return self.at(node.lineno, node.col_offset), self.at(end_line, end_col)


ARITHMETIC = {
    ast.Add: ("+", "-"),
    ast.Sub: ("-", "+"),
    ast.Mult: ("*", "/"),
    ast.Div: ("/", "*"),
    ast.FloorDiv: ("//", "*"),
    ast.Mod: ("%", "*"),
}
COMPARISON = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes (by id) whose insides no mutant touches: docstrings, annotations, f-strings,
    assert messages, logging calls."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first)
            if not isinstance(node, ast.ClassDef):
                mark(node.returns)
                for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
        elif isinstance(node, ast.Assert):
            mark(node.msg)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("logger", "logging", "warnings")
        ):
            mark(node)
    return skip


def _sites(
    function: ast.FunctionDef | ast.AsyncFunctionDef, source: str, offsets: _Offsets
) -> Iterator[tuple[ast.expr | ast.stmt, str, int, int, str]]:
    """(node, operator, start, end, replacement) for every applicable mutation."""
    skip = _skipped(function)
    body = [
        node
        for statement in function.body
        for node in ast.walk(statement)
        if isinstance(node, ast.stmt | ast.expr)  # the nodes with a position
    ]
    for node in sorted(body, key=lambda n: (n.lineno, n.col_offset)):
        if id(node) in skip or (isinstance(node, ast.Expr) and id(node.value) in skip):
            continue
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            symbol, swapped = ARITHMETIC[type(node.op)]
            gap_start = offsets.span(node.left)[1]
            gap_end = offsets.span(node.right)[0]
            gap = source[gap_start:gap_end]
            at = gap.find(symbol)
            if at >= 0 and (symbol != "/" or gap[at : at + 2] != "//"):
                yield node, "arithmetic", gap_start + at, gap_start + at + len(symbol), swapped
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            symbol, swapped = COMPARISON[type(node.ops[0])]
            gap_start = offsets.span(node.left)[1]
            gap_end = offsets.span(node.comparators[0])[0]
            gap = source[gap_start:gap_end]
            stripped = " ".join(gap.split())
            if stripped == symbol:
                yield node, "comparison", gap_start, gap_end, f" {swapped} "
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            gap_start = offsets.span(node.values[0])[1]
            gap_end = offsets.span(node.values[1])[0]
            word = "and" if isinstance(node.op, ast.And) else "or"
            if " ".join(source[gap_start:gap_end].split()) == word:
                swapped = "or" if word == "and" else "and"
                yield node, "boolean", gap_start, gap_end, f" {swapped} "
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            start, end = offsets.span(node)
            operand_start, operand_end = offsets.span(node.operand)
            yield node, "not-removed", start, end, source[operand_start:operand_end]
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, "constant", *offsets.span(node), str(not node.value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, int):
            start, end = offsets.span(node)
            yield node, "constant", start, end, str(node.value + 1)
            if node.value != 0:
                yield node, "constant", start, end, "0"
        if isinstance(node, ast.If | ast.While | ast.IfExp) and id(node.test) not in skip:
            start, end = offsets.span(node.test)
            yield node, "condition-negated", start, end, f"not ({source[start:end]})"
        removable = isinstance(node, ast.AugAssign | ast.Assign | ast.Raise) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        )
        if removable:
            yield node, "statement-removed", *offsets.span(node), "pass"
        elif (
            isinstance(node, ast.Return)
            and node.value is not None
            and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):
            yield node, "statement-removed", *offsets.span(node), "return None"


@dataclass(frozen=True)
class Enumeration:
    mutants: list[AstMutant]
    unparseable: int  # mutants dropped because their text does not parse


def enumerate_mutants(source: str, file: Path, qualname: str) -> Enumeration:
    """Every first-order mutant of function ``qualname`` in ``source`` (the text of ``file``)."""
    tree = ast.parse(source)
    function = find_function(tree, qualname)
    offsets = _Offsets(source)
    mutants: list[AstMutant] = []
    unparseable = 0
    seen: dict[tuple[int, int, str], int] = {}
    for node, operator, start, end, replacement in _sites(function, source, offsets):
        line, col = node.lineno, node.col_offset
        index = seen.get((line, col, operator), 0)
        seen[line, col, operator] = index + 1
        mutant = AstMutant(
            file, qualname, line, col, operator, index, start, end, replacement, source[start:end]
        )
        try:
            ast.parse(mutant.apply(source))
        except SyntaxError:
            unparseable += 1
            continue
        mutants.append(mutant)
    return Enumeration(mutants, unparseable)


def candidates() -> list[AstMutant]:
    """Every mutant of every covered function of the installed vLLM."""
    out: list[AstMutant] = []
    sources: dict[Path, str] = {}
    for covered in COVERED:
        if covered.file not in sources:
            sources[covered.file] = installed_file(covered.file).read_text()
        out += enumerate_mutants(sources[covered.file], covered.file, covered.qualname).mutants
    return out


def sample(mutants: list[AstMutant], n: int, seed: int) -> list[AstMutant]:
    """``n`` mutants (all when fewer), stratified by function: each function gets a share
    proportional to its mutants and at least one; the rest are drawn at random. Sorted by id;
    the same ``mutants``, ``n`` and ``seed`` give the same sample."""
    ordered = sorted(mutants, key=lambda m: m.id)
    if n >= len(ordered):
        return ordered
    rng = random.Random(seed)
    by_function: dict[tuple[Path, str], list[AstMutant]] = {}
    for mutant in ordered:
        by_function.setdefault((mutant.file, mutant.qualname), []).append(mutant)
    chosen: list[AstMutant] = []
    for group in by_function.values():
        share = max(1, len(group) * n // len(ordered))
        chosen += rng.sample(group, min(share, len(group)))
    taken = {m.id for m in chosen}
    if len(chosen) < n:
        chosen += rng.sample([m for m in ordered if m.id not in taken], n - len(chosen))
    while len(chosen) > n:  # the floors of one overshot: drop from functions with several
        counts: dict[tuple[Path, str], int] = {}
        for m in chosen:
            counts[m.file, m.qualname] = counts.get((m.file, m.qualname), 0) + 1
        droppable = [i for i, m in enumerate(chosen) if counts[m.file, m.qualname] > 1] or list(
            range(len(chosen))
        )
        chosen.pop(rng.choice(droppable))
    return sorted(chosen, key=lambda m: m.id)


def write_mutant_file(mutant: AstMutant, dest_dir: Path) -> Path:
    """The mutated copy of the installed file at ``dest_dir / mutant.file`` (the installed file
    is never edited); its path, for ``--target=vllm-file:PATH``."""
    return write_mutated_copy(mutant.file, dest_dir, mutant.apply)
