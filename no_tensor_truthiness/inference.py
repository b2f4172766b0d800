"""Inference: what one module's expressions hold, from the syntax alone.

A value is a :class:`~no_tensor_truthiness.kinds.Kind` (what its truth value means) or
:class:`~no_tensor_truthiness.kinds.Items` (a container whose elements are known: what iterating,
indexing or unpacking it yields). Tensor-ness comes from, in order of strength:

- ``torch.*`` constructors and ops and ``torch.nn.functional.*`` (and their aliases): a tensor
  whatever their arguments' types, a 0-d tensor only from a 0-d argument of an op that keeps the
  number of elements; ``nn.Parameter``; tuple-returning ops (``torch.split``, ``chunk``,
  ``unbind``, ``sort``, ``max(dim=)``, ...) give containers of tensors;
- tensor methods on tensors (``x.float()``, ``x.view(...)``; not ``.item()``, ``.numel()``,
  ``.tolist()``, ``.shape``; full reductions such as ``.any()`` or ``.sum()`` give a 0-d tensor,
  whose truth is defined);
- annotations: parameters, variables, class attributes and function returns annotated
  ``Tensor`` / ``Tensor | None`` / ``Optional[Tensor]``, and containers of them
  (``list[Tensor]``, ``tuple[Tensor, ...]``, ``Sequence[Tensor]``, ``dict[str, Tensor]``, ...);
- ``.pop`` / ``.get`` / subscripts of multimodal input keys (``*_embeds``, ``pixel_values*``,
  ``*_features``, ...): a tensor, a list or None;
- assignments, walrus bindings, ``for`` targets, comprehensions, tuple unpacking, arithmetic and
  comparisons of the above; branches join (``x = None`` on one path and a tensor on the other
  gives "tensor or None").

``isinstance(x, list)`` / ``isinstance(x, torch.Tensor)`` / ``x is None`` narrow ``x`` inside the
branch. Subscripts and rows of tensors (``mask[i]``, ``for row in x``) are not tensors here: they
are often 0-d.

The inference is one class composed of layers, each a module: :mod:`~no_tensor_truthiness.kinds`
(the values), :mod:`~no_tensor_truthiness.syntax` (helpers over the tree),
:mod:`~no_tensor_truthiness.annotations` (annotations read into kinds, the module pre-pass),
:mod:`~no_tensor_truthiness.evaluation` (expressions and bindings) and
:mod:`~no_tensor_truthiness.narrowing` (what a test tells inside its branches).
"""

from __future__ import annotations

from no_tensor_truthiness.narrowing import Narrowing


class Inference(Narrowing):
    """The state of one module's inference: the environment of the scope being checked, the
    module's functions and classes, and where annotated names got their kind (annotations,
    evaluation and narrowing, layered)."""
