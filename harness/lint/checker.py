"""The checker: one pass over a module's ``ast`` that infers which expressions are tensors and
reports those whose truth value is taken.

Tensor-ness comes from, in order of strength:

- ``torch.*`` constructors and ops, ``torch.nn.functional.*`` (and its aliases), ``nn.Parameter``;
- tensor methods on tensors (``x.float()``, ``x.view(...)``; not ``.item()``, ``.numel()``,
  ``.tolist()``, ``.shape``; full reductions such as ``.any()`` or ``.sum()`` give a 0-d tensor,
  whose truth is defined);
- annotations: parameters, variables, class attributes and function returns annotated
  ``Tensor`` / ``torch.Tensor`` / ``Tensor | None`` / ``Optional[Tensor]`` in the same module;
- ``.pop`` / ``.get`` / subscripts of multimodal input keys (``*_embeds``, ``pixel_values*``,
  ``*_features``, ...): a tensor, a list or None;
- assignments, walrus bindings, arithmetic and comparisons of the above; branches join
  (``x = None`` on one path and a tensor on the other gives "tensor or None").

``isinstance(x, list)`` / ``isinstance(x, torch.Tensor)`` narrow ``x`` inside the branch.
Subscripts of tensors (``mask[i]``) are not flagged: they are often 0-d.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from harness.lint.rules import FLAGGED, Kind, message

#: The type-aware mode's lookup: an expression's kind as mypy inferred it, or None.
Oracle = Callable[[ast.expr], "Kind | None"]

#: Multimodal input keys whose values are tensors, lists of tensors or None.
DEFAULT_TENSOR_KEY = (
    r"^pixel_values|_embeds$|_attention_mask$"
    r"|^(image|video|audio|vision|visual|mm|multimodal|speech|sound|input_audio|input)"
    r"_(embeddings|features)$"
)

# torch.<name>(...) that build a tensor whatever their arguments.
TORCH_CONSTRUCTORS = frozenset(
    """
    tensor as_tensor asarray from_numpy frombuffer zeros zeros_like ones ones_like empty
    empty_like empty_strided full full_like arange range linspace logspace eye rand rand_like
    randn randn_like randint randint_like randperm cat concat concatenate stack hstack vstack
    dstack column_stack block_diag cartesian_prod combinations meshgrid nonzero argwhere
    masked_select
    """.split()
)
# torch.<name>(...) that return tensors shaped by their first argument (torch.equal, allclose,
# is_tensor and numel return Python values; torch.cuda.*, torch.backends.* are not tensor ops).
TORCH_TENSOR_FUNCS = frozenset(
    """
    tensor as_tensor asarray from_numpy frombuffer zeros zeros_like ones ones_like empty
    empty_like empty_strided full full_like arange range linspace logspace eye rand rand_like
    randn randn_like randint randint_like randperm normal bernoulli multinomial poisson cat
    concat concatenate stack hstack vstack dstack column_stack split_with_sizes where
    masked_select index_select gather scatter scatter_add take take_along_dim nonzero argwhere
    tril triu diag diagonal diag_embed outer einsum matmul mm bmm baddbmm addmm addmv mv dot
    tensordot kron cross cumsum cumprod cummax cummin flip fliplr flipud roll rot90
    repeat_interleave
    tile broadcast_to reshape flatten unflatten squeeze unsqueeze transpose permute movedim
    swapaxes narrow select clone abs absolute neg negative exp exp2 expm1 log log2 log10 log1p
    sqrt rsqrt square pow sin cos tan tanh sigmoid softmax log_softmax relu gelu silu erf
    clamp clip clamp_min clamp_max floor ceil round trunc frac sign sgn add sub subtract mul
    multiply div divide true_divide floor_divide remainder fmod maximum minimum fmax fmin
    lerp addcmul addcdiv logical_and logical_or logical_not logical_xor bitwise_and
    bitwise_or bitwise_not bitwise_xor eq ne lt le gt ge greater less greater_equal less_equal
    not_equal isclose isnan isinf isfinite isin isneginf isposinf bucketize searchsorted
    histc bincount unique unique_consecutive sort argsort topk kthvalue cdist cosine_similarity
    pairwise_distance nan_to_num masked_fill index_put index_add index_copy index_fill
    polar complex real imag view_as_real view_as_complex conj block_diag cartesian_prod
    combinations meshgrid atleast_1d atleast_2d atleast_3d chunk_cat dsplit
    """.split()
)
# Constructors that build a 0-d tensor from an empty shape or a single Python number.
TORCH_SCALAR_CONSTRUCTORS = frozenset("rand randn zeros ones empty full tensor as_tensor".split())
# torch.<name>(x) that reduce everything to a 0-d tensor when called without a dim.
TORCH_REDUCTIONS = frozenset(
    "any all sum mean prod max min amax amin norm std var median count_nonzero logsumexp".split()
)
# Tensor methods whose result is not a tensor.
NON_TENSOR_METHODS = frozenset(
    """
    item tolist numel nelement dim ndimension size stride storage_offset element_size
    is_contiguous is_floating_point is_complex is_signed data_ptr get_device equal allclose
    numpy split chunk unbind tensor_split hsplit vsplit untyped_storage __len__ type
    is_pinned is_shared is_set_to has_names
    """.split()
)
# Tensor attributes that are not tensors.
NON_TENSOR_ATTRS = frozenset(
    """
    shape dtype device ndim is_cuda is_cpu is_meta is_sparse is_quantized requires_grad
    layout names itemsize nbytes is_leaf grad_fn
    """.split()
)
TENSOR_ATTRS = frozenset("T mT H mH data real imag".split())

#: Source text of an expression that may hold a nested truth context or a binding.
_NESTED_CONTEXT = re.compile(r"\b(?:and|or|not|if|bool|lambda)\b|:=")
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int  # 1-based
    code: str
    message: str
    end_line: int = 0
    end_col: int = 0

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


def _join(a: Kind, b: Kind) -> Kind:
    """The kind of a name after two control-flow paths."""
    if a is b:
        return a
    pair = {a, b}
    if pair <= {Kind.TENSOR, Kind.OPTIONAL, Kind.NONE}:
        return Kind.OPTIONAL
    return Kind.UNKNOWN


def _join_envs(first: dict[str, Kind], second: dict[str, Kind]) -> dict[str, Kind]:
    return {
        name: _join(first.get(name, Kind.UNKNOWN), second.get(name, Kind.UNKNOWN))
        for name in first.keys() | second.keys()
    }


class _Imports:
    """Which local names refer to torch, torch.nn.functional, Tensor and Parameter."""

    def __init__(self, tree: ast.Module) -> None:
        self.torch = {"torch"}
        self.functional: set[str] = set()
        self.nn: set[str] = set()
        self.tensor_types = {"Tensor"}
        self.parameter = {"Parameter"}
        for node in _top_level(tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    if alias.name == "torch":
                        self.torch.add(local)
                    elif alias.name == "torch.nn.functional" and alias.asname:
                        self.functional.add(alias.asname)
                    elif alias.name == "torch.nn" and alias.asname:
                        self.nn.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    local = alias.asname or alias.name
                    if node.module == "torch" and alias.name == "Tensor":
                        self.tensor_types.add(local)
                    elif node.module == "torch" and alias.name == "nn":
                        self.nn.add(local)
                    elif node.module == "torch.nn" and alias.name == "functional":
                        self.functional.add(local)
                    elif node.module in ("torch.nn", "torch.nn.parameter") and (
                        alias.name == "Parameter"
                    ):
                        self.parameter.add(local)


def _top_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, looking into ``if`` / ``try`` blocks (where imports hide)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


class ModuleChecker:
    """Checks one parsed module. ``findings`` holds the results after :meth:`run`."""

    def __init__(
        self,
        tree: ast.Module,
        source: str,
        path: str,
        tensor_key: str = DEFAULT_TENSOR_KEY,
        oracle: Oracle | None = None,
    ) -> None:
        self.tree = tree
        self.source = source
        self.path = path
        self.lines = source.splitlines()
        self.key_pattern = re.compile(tensor_key)
        self.imports = _Imports(tree)
        self.findings: list[Finding] = []
        self.oracle = oracle  # type-aware mode: mypy's verdict where the syntax has none
        self.functions: dict[str, Kind] = {}  # module-level functions' return kinds
        self.classes: dict[str, dict[str, Kind]] = {}  # class -> attr / method -> kind
        self.class_stack: list[str] = []
        self.env: dict[str, Kind] = {}
        self.module_env: dict[str, Kind] = {}
        self.origins: dict[str, ast.expr] = {}  # name -> the expression last assigned to it

    # -- annotations ---------------------------------------------------------------------

    def annotation_kind(self, node: ast.expr | None) -> Kind:
        """``Tensor`` -> TENSOR; ``Tensor | None``, ``Optional[Tensor]`` and unions containing a
        tensor -> OPTIONAL; other annotations -> NOT_TENSOR."""
        if node is None:
            return Kind.UNKNOWN
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return Kind.UNKNOWN
        if isinstance(node, ast.Constant) and node.value is None:
            return Kind.NONE
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self._union([node.left, node.right])
        if isinstance(node, ast.Subscript):
            base = _dotted(node.value)
            name = base[-1] if base else ""
            if name == "Optional":
                inner = self.annotation_kind(node.slice)
                return Kind.OPTIONAL if inner in FLAGGED else Kind.NOT_TENSOR
            if name == "Union":
                elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
                return self._union(elts)
            if name == "Annotated":
                first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
                return self.annotation_kind(first)
            return Kind.NOT_TENSOR
        parts = _dotted(node)
        if parts is not None:
            if parts[-1] in self.imports.tensor_types and len(parts) == 1:
                return Kind.TENSOR
            if parts[-1] in ("Tensor", "Parameter") and parts[0] in self.imports.torch | {"nn"}:
                return Kind.TENSOR
            if len(parts) == 1 and parts[0] in self.imports.parameter:
                return Kind.TENSOR
            if len(parts) == 2 and parts[0] in self.imports.nn and parts[1] == "Parameter":
                return Kind.TENSOR
        return Kind.NOT_TENSOR

    def _union(self, members: Sequence[ast.expr]) -> Kind:
        kinds = [self.annotation_kind(m) for m in members]
        if any(k in FLAGGED for k in kinds):
            return Kind.OPTIONAL if len(kinds) > 1 else kinds[0]
        return Kind.NOT_TENSOR

    # -- the module pre-pass: functions, class attributes -------------------------------

    def collect(self) -> None:
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = self.annotation_kind(node.returns)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = self._class_members(node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                self.module_env[node.target.id] = self.annotation_kind(node.annotation)

    def _class_members(self, cls: ast.ClassDef) -> dict[str, Kind]:
        """Class-level annotations and method return kinds. ``self.x`` assignments and
        ``register_buffer`` calls are recorded as the methods are checked (see :meth:`bind`)."""
        members: dict[str, Kind] = {}
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                members[node.target.id] = self.annotation_kind(node.annotation)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                members[node.name + "()"] = self.annotation_kind(node.returns)
        return members

    def record_attribute(self, target: ast.expr, kind: Kind) -> None:
        """``self.x = <tensor>`` / ``self.x: Tensor`` inside a class: ``self.x`` is a tensor in
        every method checked afterwards (an annotation wins over an assignment)."""
        if not self.class_stack or not _is_self_attr(target):
            return
        assert isinstance(target, ast.Attribute)
        members = self.classes.setdefault(self.class_stack[-1], {})
        if kind in FLAGGED and target.attr not in members:
            members[target.attr] = kind

    # -- inference ----------------------------------------------------------------------

    def kind(self, node: ast.expr) -> Kind:
        env = self.env
        if isinstance(node, ast.Name):
            return env.get(node.id, self.module_env.get(node.id, Kind.UNKNOWN))
        if isinstance(node, ast.Constant):
            return Kind.NONE if node.value is None else Kind.NOT_TENSOR
        if isinstance(node, ast.NamedExpr):
            return self.kind(node.value)
        if isinstance(node, ast.Call):
            return self.call_kind(node)
        if isinstance(node, ast.Attribute):
            if _is_self_attr(node) and self.class_stack:
                return self.classes.get(self.class_stack[-1], {}).get(node.attr, Kind.UNKNOWN)
            base = self.kind(node.value)
            if base in FLAGGED:
                if node.attr in TENSOR_ATTRS:
                    return Kind.TENSOR
                return Kind.NOT_TENSOR if node.attr in NON_TENSOR_ATTRS else Kind.UNKNOWN
            return Kind.UNKNOWN
        if isinstance(node, ast.BinOp):
            sides = {self.kind(node.left), self.kind(node.right)}
            if sides & FLAGGED:
                return Kind.TENSOR
            return Kind.SCALAR if Kind.SCALAR in sides else Kind.UNKNOWN
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return Kind.NOT_TENSOR
            inner = self.kind(node.operand)
            return Kind.TENSOR if inner in FLAGGED else inner
        if isinstance(node, ast.Compare):
            if any(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return Kind.NOT_TENSOR
            sides = {self.kind(node.left), *(self.kind(c) for c in node.comparators)}
            if sides & FLAGGED:
                return Kind.TENSOR
            return Kind.SCALAR if Kind.SCALAR in sides else Kind.NOT_TENSOR
        if isinstance(node, ast.IfExp):
            return _join(self.kind(node.body), self.kind(node.orelse))
        if isinstance(node, ast.Subscript):
            key = node.slice
            if (
                isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and (self.key_pattern.search(key.value))
            ):
                return Kind.OPTIONAL
            return Kind.UNKNOWN
        if isinstance(
            node,
            (
                ast.List,
                ast.Tuple,
                ast.Dict,
                ast.Set,
                ast.ListComp,
                ast.DictComp,
                ast.SetComp,
                ast.GeneratorExp,
                ast.JoinedStr,
            ),
        ):
            return Kind.NOT_TENSOR
        return Kind.UNKNOWN

    def call_kind(self, node: ast.Call) -> Kind:
        func = node.func
        parts = _dotted(func)
        if parts is not None:
            head, name = parts[0], parts[-1]
            if len(parts) == 2 and head in self.imports.torch:
                if name in TORCH_SCALAR_CONSTRUCTORS and _scalar_construction(node, name):
                    return Kind.SCALAR
                if name in TORCH_REDUCTIONS:
                    return Kind.SCALAR if _no_dim(node, positional=1) else Kind.TENSOR
                if name in TORCH_CONSTRUCTORS:
                    return Kind.TENSOR
                if name in TORCH_TENSOR_FUNCS:
                    return self._first_argument_kind(node)
                return Kind.NOT_TENSOR
            if (
                len(parts) == 4
                and head in self.imports.torch
                and parts[1:3] == ["nn", "functional"]
            ) or (len(parts) == 2 and head in self.imports.functional):
                return self._first_argument_kind(node)
            if (
                parts in (["nn", "Parameter"], ["torch", "nn", "Parameter"])
                or (len(parts) == 1 and head in self.imports.parameter)
                or (len(parts) == 2 and head in self.imports.nn and name == "Parameter")
            ):
                return Kind.TENSOR
            if len(parts) == 1:
                if head in (
                    "len",
                    "isinstance",
                    "bool",
                    "int",
                    "float",
                    "str",
                    "list",
                    "tuple",
                    "dict",
                    "set",
                    "sorted",
                    "any",
                    "all",
                    "type",
                    "id",
                    "hash",
                ):
                    return Kind.NOT_TENSOR
                return self.functions.get(head, Kind.UNKNOWN)
            if len(parts) == 2 and head == "self" and self.class_stack:
                members = self.classes.get(self.class_stack[-1], {})
                if name + "()" in members:
                    return members[name + "()"]
        if isinstance(func, ast.Attribute):
            if func.attr in ("pop", "get") and node.args:
                key = node.args[0]
                default = node.args[1] if len(node.args) > 1 else None
                plain_default = isinstance(default, ast.Constant) and default.value is not None
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(key.value, str)
                    and self.key_pattern.search(key.value)
                    and not plain_default  # pop("x_embeds", False): a flag, not an input
                ):
                    return Kind.OPTIONAL
            receiver = self.kind(func.value)
            if receiver in FLAGGED or receiver is Kind.SCALAR:
                if func.attr in NON_TENSOR_METHODS:
                    return Kind.NOT_TENSOR
                if func.attr in TORCH_REDUCTIONS and _no_dim(node, positional=0):
                    return Kind.SCALAR
                return Kind.SCALAR if receiver is Kind.SCALAR else Kind.TENSOR
        return Kind.UNKNOWN

    def _first_argument_kind(self, node: ast.Call) -> Kind:
        """Ops that keep their input's shape: a tensor in, a tensor out; a 0-d tensor in, a 0-d
        tensor out; unknown in, unknown out (``torch.isnan(loss)`` on a scalar loss is fine)."""
        if not node.args:
            return Kind.UNKNOWN
        first = node.args[0]
        if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
            first = first.elts[0]
        kind = self.kind(first)
        if kind in FLAGGED:
            return Kind.TENSOR
        return Kind.SCALAR if kind is Kind.SCALAR else Kind.UNKNOWN

    # -- reporting ----------------------------------------------------------------------

    def kind_or_oracle(self, node: ast.expr) -> tuple[Kind, bool]:
        """The syntactic kind; where it is unknown, the oracle's (and whether it was used)."""
        kind = self.kind(node)
        if kind is Kind.UNKNOWN and self.oracle is not None:
            typed = self.oracle(node)
            if typed is not None and typed in FLAGGED:
                return typed, True
        return kind, False

    def report(self, node: ast.expr, code: str, kind: Kind, typed: bool = False) -> None:
        text = ast.get_source_segment(self.source, node) or type(node).__name__
        text = " ".join(text.split())
        if len(text) > 60:
            text = text[:57] + "..."
        self.findings.append(
            Finding(
                self.path,
                node.lineno,
                node.col_offset + 1,
                code,
                message(code, kind, text, elementwise=isinstance(node, ast.Compare))
                + (" [type-aware]" if typed else ""),
                node.end_lineno or node.lineno,
                (node.end_col_offset or 0) + 1,
            )
        )

    def truth(self, node: ast.expr, code: str) -> None:
        """``node``'s truth value is taken (in a context reported as ``code``)."""
        if isinstance(node, ast.BoolOp):
            self.boolop(node, node.values)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.truth(node.operand, "TB003")
            return
        if isinstance(node, ast.NamedExpr):
            self.walk(node.value)
            kind, typed = self.kind_or_oracle(node.value)
            self.env[node.target.id] = kind
            if kind in FLAGGED:
                self.report(node, "TB009", kind, typed)
            return
        kind, typed = self.kind_or_oracle(node)
        if kind in FLAGGED:
            self.report(node, code, kind, typed)
        self.walk(node)

    def walk(self, node: ast.AST) -> None:
        """Visit an expression's parts for nested truth contexts and bindings.

        Most expressions hold none: their source lines are tested with one regex first."""
        if isinstance(node, ast.expr) and not self._may_nest(node):
            return
        self._walk(node)

    def _may_nest(self, node: ast.expr) -> bool:
        first, last = node.lineno, node.end_lineno or node.lineno
        text = self.lines[first - 1] if first == last else "\n".join(self.lines[first - 1 : last])
        return _NESTED_CONTEXT.search(text) is not None

    def boolop(self, node: ast.BoolOp, tested: Sequence[ast.expr]) -> None:
        """Truth-test ``tested`` operands (the rest are walked), each seeing what the earlier
        ones imply: in ``isinstance(x, list) and not x``, ``x`` is a list."""
        before = dict(self.env)
        for operand in node.values:
            if any(operand is t for t in tested):
                self.truth(operand, "TB004")
            else:
                self._walk(operand)
            positive, negative = self.narrowing(operand)
            changes = positive if isinstance(node.op, ast.And) else negative
            self.env = self.narrowed(self.env, changes)
        self.env = before

    def _walk(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            self.boolop(node, node.values[:-1])
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.truth(node.operand, "TB003")
        elif isinstance(node, ast.IfExp):
            self.truth(node.test, "TB007")
            self._walk(node.body)
            self._walk(node.orelse)
        elif isinstance(node, ast.NamedExpr):
            self._walk(node.value)
            self.env[node.target.id] = self.kind(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "bool"
            and len(node.args) == 1
        ):
            self.truth(node.args[0], "TB006")
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            saved = dict(self.env)
            for gen in node.generators:
                self._walk(gen.iter)
                for name in _bound_names(gen.target):
                    self.env[name] = Kind.UNKNOWN
                for condition in gen.ifs:
                    self.truth(condition, "TB008")
            if isinstance(node, ast.DictComp):
                self._walk(node.key)
                self._walk(node.value)
            else:
                self._walk(node.elt)
            self.env = saved
        elif isinstance(node, ast.Lambda):
            saved = dict(self.env)
            for arg in _all_args(node.args):
                self.env[arg.arg] = Kind.UNKNOWN
            self._walk(node.body)
            self.env = saved
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self._walk(child)

    # -- statements ---------------------------------------------------------------------

    def body(self, statements: Sequence[ast.stmt]) -> None:
        for statement in statements:
            self.stmt(statement)

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.function(node)
        elif isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                self.walk(decorator)
            self.class_stack.append(node.name)
            saved = dict(self.env)
            self.body(node.body)
            self.env = saved
            self.class_stack.pop()
        elif isinstance(node, ast.If):
            self.truth(node.test, "TB001")
            positive, negative = self.narrowing(node.test)
            before = dict(self.env)
            self.env = self.narrowed(before, positive)
            self.body(node.body)
            after_body = self.env
            self.env = self.narrowed(before, negative)
            self.body(node.orelse)
            if _always_exits(node.body):  # `if isinstance(x, Tensor): return ...`
                return  # only the else path continues
            if node.orelse and _always_exits(node.orelse):
                self.env = after_body
                return
            self.env = _join_envs(after_body, self.env)
        elif isinstance(node, ast.While):
            self.truth(node.test, "TB002")
            before = dict(self.env)
            self.body(node.body)
            self.body(node.orelse)
            self.env = _join_envs(before, self.env)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.walk(node.iter)
            before = dict(self.env)
            for name in _bound_names(node.target):
                self.env[name] = Kind.UNKNOWN
            self.body(node.body)
            self.body(node.orelse)
            self.env = _join_envs(before, self.env)
        elif isinstance(node, ast.Assert):
            self.truth(node.test, "TB005")
            if node.msg is not None:
                self.walk(node.msg)
        elif isinstance(node, ast.Assign):
            self.walk(node.value)
            kind = self.kind(node.value)
            for target in node.targets:
                self.bind(target, kind, node.value)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.walk(node.value)
            if _is_self_attr(node.target) and self.class_stack:
                assert isinstance(node.target, ast.Attribute)
                members = self.classes.setdefault(self.class_stack[-1], {})
                members[node.target.attr] = self.annotation_kind(node.annotation)
            if isinstance(node.target, ast.Name):
                declared = self.annotation_kind(node.annotation)
                if declared is Kind.NOT_TENSOR and node.value is not None:
                    declared = Kind.NOT_TENSOR
                self.env[node.target.id] = declared
        elif isinstance(node, ast.AugAssign):
            self.walk(node.value)
            if isinstance(node.target, ast.Name):
                kinds = {self.kind(node.target), self.kind(node.value)}
                if kinds & FLAGGED:
                    self.env[node.target.id] = Kind.TENSOR
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self.walk(item.context_expr)
                if item.optional_vars is not None:
                    for name in _bound_names(item.optional_vars):
                        self.env[name] = Kind.UNKNOWN
            self.body(node.body)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            self.body(node.body)
            for handler in node.handlers:
                if handler.name:
                    self.env[handler.name] = Kind.NOT_TENSOR
                self.body(handler.body)
            self.body(node.orelse)
            self.body(node.finalbody)
        elif isinstance(node, ast.Expr):
            value = node.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in ("register_buffer", "register_parameter")
                and value.args
                and isinstance(value.args[0], ast.Constant)
                and isinstance(value.args[0].value, str)
                and self.class_stack
            ):
                members = self.classes.setdefault(self.class_stack[-1], {})
                members.setdefault(value.args[0].value, Kind.TENSOR)
            self.walk(value)
        elif isinstance(node, ast.Match):
            self.walk(node.subject)
            for case in node.cases:
                if case.guard is not None:
                    self.truth(case.guard, "TB001")
                self.body(case.body)
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.walk(child)
                elif isinstance(child, ast.stmt):
                    self.stmt(child)

    def bind(self, target: ast.expr, kind: Kind, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = kind
            self.origins[target.id] = value
        elif isinstance(target, ast.Attribute):
            self.record_attribute(target, kind)
        elif isinstance(target, (ast.Tuple, ast.List)):
            values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            for i, element in enumerate(target.elts):
                if values is not None and len(values) == len(target.elts):
                    self.bind(element, self.kind(values[i]), values[i])
                else:
                    for name in _bound_names(element):
                        self.env[name] = Kind.UNKNOWN

    def narrowed(self, env: dict[str, Kind], changes: dict[str, Kind]) -> dict[str, Kind]:
        """``env`` with ``changes``, and names computed from a changed name re-derived (after
        ``r = x % 2``, narrowing ``x`` to an int narrows ``r`` too)."""
        if not changes:
            return dict(env)
        saved, self.env = self.env, {**env, **changes}
        for name, origin in self.origins.items():
            if (
                name not in changes
                and name in self.env
                and any(isinstance(n, ast.Name) and n.id in changes for n in ast.walk(origin))
            ):
                self.env[name] = self.kind(origin)
        result, self.env = self.env, saved
        return result

    def narrowing(self, test: ast.expr) -> tuple[dict[str, Kind], dict[str, Kind]]:
        """Kinds known inside the ``if`` body and the ``else`` branch."""
        if (
            isinstance(test, ast.Call)
            and isinstance(test.func, ast.Name)
            and test.func.id == "isinstance"
            and len(test.args) == 2
            and isinstance(test.args[0], ast.Name)
        ):
            name, types = test.args[0].id, test.args[1]
            members = types.elts if isinstance(types, ast.Tuple) else [types]
            tensor = any(self.annotation_kind(m) is Kind.TENSOR for m in members)
            if tensor:  # and in the else branch, whatever it is, it is not a tensor
                return {name: Kind.TENSOR}, {name: Kind.NOT_TENSOR}
            return {name: Kind.NOT_TENSOR}, {}
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.left, ast.Name)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
        ):
            name = test.left.id
            current = self.kind(test.left)
            narrowed = Kind.TENSOR if current is Kind.OPTIONAL else current
            if isinstance(test.ops[0], ast.IsNot):
                return {name: narrowed}, {name: Kind.NONE}
            if isinstance(test.ops[0], ast.Is):
                return {name: Kind.NONE}, {name: narrowed}
        return {}, {}

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for decorator in node.decorator_list:
            self.walk(decorator)
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        defaults: dict[str, ast.expr] = {
            a.arg: d
            for a, d in zip(
                positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
            )
        }
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if d is not None:
                defaults[a.arg] = d
        for value in defaults.values():
            self.walk(value)
        saved = self.env
        self.env = dict(saved)
        for arg in _all_args(args):
            kind = self.annotation_kind(arg.annotation)
            default = defaults.get(arg.arg)
            if (
                kind is Kind.TENSOR
                and isinstance(default, ast.Constant)
                and (default.value is None)
            ):
                kind = Kind.OPTIONAL
            self.env[arg.arg] = kind
        saved_origins, self.origins = self.origins, {}  # a function's own assignments
        self.body(node.body)
        self.env, self.origins = saved, saved_origins

    def run(self) -> list[Finding]:
        self.collect()
        self.body(self.tree.body)
        return self.suppressed(self.findings)

    def suppressed(self, findings: list[Finding]) -> list[Finding]:
        """Drop findings whose line carries ``# noqa`` or ``# noqa: <their code>``."""
        kept = []
        for finding in findings:
            line = self.lines[finding.line - 1] if finding.line <= len(self.lines) else ""
            match = _NOQA.search(line)
            if match is not None:
                codes = match.group("codes")
                if codes is None or finding.code in re.split(r"[\s,]+", codes.upper()):
                    continue
            kept.append(finding)
        return sorted(set(kept))


def _is_self_attr(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _scalar_construction(node: ast.Call, name: str) -> bool:
    """``torch.rand([])``, ``torch.zeros(())``, ``torch.full((), v)``, ``torch.tensor(3.0)``."""
    if not node.args:
        return False
    first = node.args[0]
    if name in ("tensor", "as_tensor"):
        return isinstance(first, ast.Constant) and isinstance(first.value, (int, float, bool))
    return (
        isinstance(first, (ast.List, ast.Tuple))
        and not first.elts
        and (name == "full" or len(node.args) == 1)
    )


def _always_exits(body: Sequence[ast.stmt]) -> bool:
    """The block never falls through: it ends in return, raise, continue or break."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _no_dim(node: ast.Call, positional: int) -> bool:
    """A reduction with no dim: no positional args beyond ``positional``, no dim/axis kw."""
    if len(node.args) > positional:
        return False
    return not any(k.arg in ("dim", "axis") for k in node.keywords)


def _bound_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def _all_args(args: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def check_source(
    source: str, path: str, tensor_key: str = DEFAULT_TENSOR_KEY, oracle: Oracle | None = None
) -> list[Finding]:
    """All findings for one file's text. Never raises: a file that cannot be parsed is one
    ``TB000`` finding; an internal error is one ``TB999`` finding (a bug to report)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [
            Finding(
                path,
                e.lineno or 1,
                (e.offset or 1),
                "TB000",
                f"syntax error, file not checked: {e.msg}",
            )
        ]
    except (ValueError, RecursionError, MemoryError) as e:
        return [Finding(path, 1, 1, "TB000", f"file not checked: {type(e).__name__}: {e}")]
    try:
        return ModuleChecker(tree, source, path, tensor_key, oracle).run()
    except RecursionError:
        return [Finding(path, 1, 1, "TB000", "file not checked: nesting too deep")]
    except Exception as e:  # a bug in the checker: one finding, never a crash
        return [Finding(path, 1, 1, "TB999", f"internal error: {type(e).__name__}: {e}")]
