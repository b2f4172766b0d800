"""Serving configurations (harness/checkpoints/serving.py): their validation, the command line they
stand for, and vLLM's engine config made from that command line."""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig

EVERY_OPTION = ServingConfig(
    dtype="float16",
    enable_mm_embeds=False,
    limit_mm_per_prompt={"image": 1, "audio": 0},
    max_model_len=2048,
    media_io_kwargs={"video": {"num_frames": 4}},
    mm_processor_kwargs={"max_num_tiles": 2},
    mamba_ssm_cache_dtype="float16",
    kv_cache_dtype="fp8",
    enable_prefix_caching=True,
    tensor_parallel_size=2,
)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"dtype": "fp8"}, "ServingConfig.dtype: expected one of"),
        ({"mamba_ssm_cache_dtype": "int8"}, "ServingConfig.mamba_ssm_cache_dtype: expected"),
        ({"kv_cache_dtype": "fp4"}, "ServingConfig.kv_cache_dtype: expected"),
        ({"max_model_len": 0}, "ServingConfig.max_model_len: expected a positive int"),
        ({"max_model_len": True}, "ServingConfig.max_model_len: expected a positive int"),
        ({"tensor_parallel_size": 0}, "ServingConfig.tensor_parallel_size: expected a positive"),
        ({"limit_mm_per_prompt": {"image": -1}}, "ServingConfig.limit_mm_per_prompt: expected"),
        ({"limit_mm_per_prompt": {"text": 1}}, "got 'text': 1"),
        ({"mm_processor_kwargs": {"x": object()}}, "ServingConfig.mm_processor_kwargs: expected"),
        ({"media_io_kwargs": [1]}, "ServingConfig.media_io_kwargs: expected a mapping, got list"),
        ({"media_io_kwargs": "{video"}, "ServingConfig.media_io_kwargs: expected a JSON object"),
    ],
)
def test_a_bad_option_is_refused_naming_it(fields, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        ServingConfig(**fields)


def test_the_command_line_of_every_option():
    assert EVERY_OPTION.cli_args() == [
        "--dtype=float16",
        '--limit-mm-per-prompt={"audio": 0, "image": 1}',
        "--max-model-len=2048",
        '--media-io-kwargs={"video": {"num_frames": 4}}',
        '--mm-processor-kwargs={"max_num_tiles": 2}',
        "--mamba-ssm-cache-dtype=float16",
        "--kv-cache-dtype=fp8",
        "--enable-prefix-caching",
        "--tensor-parallel-size=2",
    ]
    assert DEFAULT_SERVING.cli_args() == ["--enable-mm-embeds"]
    assert ServingConfig(enable_prefix_caching=False).cli_args()[-1] == "--disable-prefix-caching"


def test_names_say_what_changed():
    assert DEFAULT_SERVING.name == "default"
    assert ServingConfig(dtype="float16").name == "--dtype=float16"
    assert ServingConfig(enable_mm_embeds=False).name == "(no --enable-mm-embeds)"
    assert ServingConfig(dtype="float32", label="fp32").name == "fp32"


def test_a_mapping_and_its_json_are_one_configuration():
    given = ServingConfig(limit_mm_per_prompt={"video": 2, "image": 1})
    assert given == ServingConfig(limit_mm_per_prompt='{"image": 1, "video": 2}')
    assert given == ServingConfig(limit_mm_per_prompt='{"video": 2,  "image": 1}')
    assert hash(given) == hash(ServingConfig(limit_mm_per_prompt='{"image": 1, "video": 2}'))
    assert given.limits() == {"image": 1, "video": 2}


def test_request_options_share_the_built_model():
    built = EVERY_OPTION.model_options()
    assert built == ServingConfig(
        dtype="float16",
        max_model_len=2048,
        mamba_ssm_cache_dtype="float16",
        kv_cache_dtype="fp8",
        tensor_parallel_size=2,
    )
    assert ServingConfig(enable_mm_embeds=False).model_options() == DEFAULT_SERVING
    assert EVERY_OPTION.torch_dtype() is torch.float16
    assert DEFAULT_SERVING.torch_dtype() is None


@pytest.mark.vllm
def test_vllm_engine_config_holds_each_option():
    """The harness hands the options to vLLM's own argument parser and ``EngineArgs``: each
    lands in the engine config field ``vllm serve`` sets."""
    pytest.importorskip("vllm")
    from harness.checkpoints.cache import checkpoint_folder
    from harness.checkpoints.spec import ModelSpec
    from harness.targets.vllm import build

    serving = ServingConfig(
        dtype="float32",
        enable_mm_embeds=False,
        limit_mm_per_prompt={"image": 1},
        max_model_len=2048,
        media_io_kwargs={"video": {"num_frames": 4}},
        mm_processor_kwargs={"max_num_tiles": 2},
        mamba_ssm_cache_dtype="float16",
        enable_prefix_caching=True,
    )
    config = build.engine_config(checkpoint_folder(ModelSpec()), serving=serving)
    model, multimodal, cache = (
        config.model_config,
        config.model_config.multimodal_config,
        (config.cache_config),
    )
    assert model.dtype == torch.float32
    assert model.max_model_len == 2048
    assert multimodal.enable_mm_embeds is False
    assert multimodal.get_limit_per_prompt("image") == 1
    assert multimodal.media_io_kwargs["video"]["num_frames"] == 4
    assert multimodal.mm_processor_kwargs == {"max_num_tiles": 2}
    assert cache.mamba_ssm_cache_dtype == "float16"
    assert cache.enable_prefix_caching is True
    default = build.engine_config(checkpoint_folder(ModelSpec()))
    assert default.model_config.multimodal_config.enable_mm_embeds is True
    assert default.model_config.dtype == torch.bfloat16  # the folder's saved dtype
