"""``--tensor-parallel-size N`` on one CPU process: the weight shard each rank's loader fills.

vLLM's parallel layers size themselves, and their ``weight_loader``s pick their slice of a
checkpoint tensor, from ``get_tensor_model_parallel_world_size()`` and
``get_tensor_model_parallel_rank()``, which read the live tensor-parallel ``GroupCoordinator``'s
``world_size`` and ``rank_in_group``. :func:`faked_tensor_parallel_group` sets those two
attributes on the harness's one-process group (:mod:`.runtime`) for the time of one build and
restores them after, so nothing else sees the faked size; :func:`rank_parameters` builds and
loads the folder's model there as for a user (``build.build_and_load``: the engine config of
``--tensor-parallel-size N``, vLLM's constructor, ``DefaultModelLoader.load_weights`` reading
the folder, post-load processing), once per rank.

Only construction and loading run under the faked group: a forward pass needs the group's
device communicator (an all-reduce), which a one-process group has not
(``ValueError: No device communicator found``).
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Iterator

import torch

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.targets.vllm import build
from harness.targets.vllm.runtime import init_cpu_runtime


@contextlib.contextmanager
def faked_tensor_parallel_group(size: int, rank: int) -> Iterator[None]:
    """The process's tensor-parallel group reports ``size`` ranks and ``rank`` as its own until
    the block ends (restored even when the block raises)."""
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} outside 0..{size - 1}")
    init_cpu_runtime()
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    saved = (group.world_size, group.rank_in_group)
    group.world_size, group.rank_in_group = size, rank
    try:
        yield
    finally:
        group.world_size, group.rank_in_group = saved


def rank_parameters(
    module: types.ModuleType, spec: ModelSpec, tp_size: int, rank: int, timings: build.Timings
) -> dict[str, torch.Tensor]:
    """The parameters of rank ``rank`` of ``tp_size`` after vLLM's loader filled them from
    ``spec``'s checkpoint folder, by vLLM parameter name (detached, on the CPU)."""
    serving = ServingConfig(tensor_parallel_size=tp_size)
    with faked_tensor_parallel_group(tp_size, rank):
        model, _ = build.build_and_load(
            module,
            checkpoint_folder(spec),
            timings,
            spec.processor_options,
            spec.video_pruning_rate,
            serving=serving,
        )
    return {name: parameter.detach() for name, parameter in model.named_parameters()}


def tensor_parallel_shards(
    module: types.ModuleType, spec: ModelSpec, tp_size: int
) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, dict[str, float]]]:
    """Every rank's parameters (see :func:`rank_parameters`), and the seconds each rank's build
    took (keyed ``"<spec> tp<N> rank<r>"``)."""
    shards: dict[int, dict[str, torch.Tensor]] = {}
    timings: dict[str, dict[str, float]] = {}
    for rank in range(tp_size):
        start = time.perf_counter()
        steps = build.Timings()
        shards[rank] = rank_parameters(module, spec, tp_size, rank, steps)
        timings[f"{spec.slug} tp{tp_size} rank{rank}"] = {
            "total_s": round(time.perf_counter() - start, 3),
            **steps.as_dict(),
        }
    return shards, timings
