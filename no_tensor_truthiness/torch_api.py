"""What torch's API returns, by name: the tables the inference reads.

Each table answers one question about a ``torch.<name>(...)`` call or a ``tensor.<name>(...)``
method call. They are facts about torch's API, kept as plain name sets so the lint imports no
torch.
"""

from __future__ import annotations

# torch.<name>(...) that build a tensor whatever their arguments.
TORCH_CONSTRUCTORS = frozenset(
    """
    tensor as_tensor asarray from_numpy frombuffer zeros zeros_like ones ones_like empty
    empty_like empty_strided full full_like arange range linspace logspace eye rand rand_like
    randn randn_like randint randint_like randperm cat concat concatenate stack hstack vstack
    dstack column_stack block_diag cartesian_prod combinations argwhere masked_select
    """.split()
)
# torch.<name>(...) that return one tensor whatever their arguments' types (torch.equal,
# allclose, is_tensor and numel return Python values; torch.cuda.*, torch.backends.* are not
# tensor ops). A 0-d argument gives a 0-d result unless the op is in NUMEL_CHANGING.
TORCH_TENSOR_FUNCS = frozenset(
    """
    tensor as_tensor asarray from_numpy frombuffer zeros zeros_like ones ones_like empty
    empty_like empty_strided full full_like arange range linspace logspace eye rand rand_like
    randn randn_like randint randint_like randperm normal bernoulli multinomial poisson cat
    concat concatenate stack hstack vstack dstack column_stack where
    masked_select index_select gather scatter scatter_add take take_along_dim nonzero argwhere
    tril triu diag diagonal diag_embed outer einsum matmul mm bmm baddbmm addmm addmv mv dot
    tensordot kron cross cumsum cumprod flip fliplr flipud roll rot90 repeat_interleave
    tile broadcast_to reshape flatten unflatten squeeze unsqueeze transpose permute movedim
    swapaxes narrow select clone abs absolute neg negative exp exp2 expm1 log log2 log10 log1p
    sqrt rsqrt square pow sin cos tan tanh sigmoid softmax log_softmax relu gelu silu erf
    clamp clip clamp_min clamp_max floor ceil round trunc frac sign sgn add sub subtract mul
    multiply div divide true_divide floor_divide remainder fmod maximum minimum fmax fmin
    lerp addcmul addcdiv logical_and logical_or logical_not logical_xor bitwise_and
    bitwise_or bitwise_not bitwise_xor eq ne lt le gt ge greater less greater_equal less_equal
    not_equal isclose isnan isinf isfinite isin isneginf isposinf bucketize searchsorted
    histc bincount unique unique_consecutive cdist cosine_similarity
    pairwise_distance nan_to_num masked_fill index_put index_add index_copy index_fill
    polar complex real imag view_as_real view_as_complex conj block_diag cartesian_prod
    combinations atleast_1d atleast_2d atleast_3d chunk_cat argsort
    """.split()
)
# Of TORCH_TENSOR_FUNCS, those whose result may have more elements than a 0-d argument.
NUMEL_CHANGING = frozenset(
    """
    cat concat concatenate stack hstack vstack dstack column_stack where masked_select
    index_select gather take take_along_dim nonzero argwhere diag diag_embed outer einsum kron
    repeat_interleave tile broadcast_to histc bincount unique unique_consecutive cdist
    block_diag cartesian_prod combinations chunk_cat
    """.split()
)
# Constructors that build a 0-d tensor from an empty shape or a single Python number.
TORCH_SCALAR_CONSTRUCTORS = frozenset("rand randn zeros ones empty full tensor as_tensor".split())
# torch.<name>(x) and x.<name>() that reduce everything to a 0-d tensor when called without a
# dim (with one, a tensor; max, min and median with a dim give a (values, indices) tuple).
TORCH_REDUCTIONS = frozenset(
    "any all sum mean prod max min amax amin norm std var median count_nonzero logsumexp".split()
)
# Reductions that return (values, indices) when given a dim.
DIM_TUPLE_REDUCTIONS = frozenset("max min median nanmedian mode".split())
# torch.<name>(...) and tensor methods that always return a tuple (or named tuple) of tensors.
TUPLE_OF_TENSORS = frozenset(
    """
    split split_with_sizes chunk unbind tensor_split hsplit vsplit dsplit meshgrid
    broadcast_tensors sort topk kthvalue cummax cummin aminmax frexp slogdet mode
    """.split()
)
# torch.linalg.<name>(x) that give a 0-d tensor without a dim (the norm of everything).
LINALG_NORMS = frozenset("vector_norm norm".split())
# Functions and methods that return a tuple of tensors only when asked to by a keyword
# (``unique(return_counts=True)``, ``nonzero(as_tuple=True)``).
TUPLE_WHEN_ASKED = {
    "unique": ("return_inverse", "return_counts"),
    "unique_consecutive": ("return_inverse", "return_counts"),
    "nonzero": ("as_tuple",),
}
# Tensor methods whose result is not a tensor.
NON_TENSOR_METHODS = frozenset(
    """
    item tolist numel nelement dim ndimension size stride storage_offset element_size
    is_contiguous is_floating_point is_complex is_signed data_ptr get_device equal allclose
    numpy untyped_storage _typed_storage storage __len__ type dense_dim sparse_dim _nnz qscheme
    q_scale q_zero_point
    """.split()
)
# Tensor methods named like these answer a question: ``is_inference()``, ``_is_view()``.
NON_TENSOR_METHOD_PREFIXES = ("is_", "has_", "_is_")
# Tensor attributes that are not tensors.
NON_TENSOR_ATTRS = frozenset(
    """
    shape dtype device ndim is_cuda is_cpu is_meta is_sparse is_quantized requires_grad
    layout names itemsize nbytes is_leaf grad_fn
    """.split()
)
# Tensor attributes that are tensors.
TENSOR_ATTRS = frozenset("T mT H mH data real imag".split())
# Fields of the named tuples the tuple-returning ops give (``x.max(dim=1).values``).
NAMED_TUPLE_TENSOR_FIELDS = frozenset("values indices min max mantissa exponent".split())
# Python builtins whose result is never a tensor.
NON_TENSOR_BUILTINS = frozenset(
    "len isinstance bool int float str dict any all type id hash repr callable hasattr".split()
)
# Builtins that make a container of their argument's elements.
ELEMENT_PRESERVING_BUILTINS = frozenset("list tuple sorted reversed iter set frozenset".split())
# Typing names of homogeneous containers, and of mappings (whose last argument is the value).
SEQUENCE_TYPES = frozenset(
    """
    list List Sequence MutableSequence Iterable Iterator Collection Set AbstractSet MutableSet
    set frozenset FrozenSet deque Deque Generator AsyncIterator AsyncIterable Reversible
    """.split()
)
MAPPING_TYPES = frozenset(
    "dict Dict Mapping MutableMapping OrderedDict defaultdict DefaultDict ChainMap".split()
)
