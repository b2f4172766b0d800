"""Recording which config fields vLLM's model code reads, and ignoring one: on vLLM's real
processor and the checkpoint folders' real config objects. What the processor must read is the
architecture brief's list (``../shared/design/architecture.md`` §1.1: the fields vLLM reads)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import DEFAULT_MAX_NUM_TILES, ModelSpec
from harness.model_files import PROCESSOR_FILE
from harness.plugin.config_reads import (
    ARGS_SECTION,
    OPTION_SECTION,
    ConfigReads,
    ConfigReadsError,
    checkpoint_config,
    parse_field,
    section_of,
)
from reference_impl.tokenizer import build_tokenizer
from suites.harness.helpers import needs_vllm

pytestmark = needs_vllm

#: The tiling fields the brief says the processor reads from the top-level config.
PROCESSOR_READS = {
    "force_image_size",
    "patch_size",
    "downsample_ratio",
    "use_thumbnail",
    "norm_mean",
    "norm_std",
}


def _processor(spec: ModelSpec, recorder: ConfigReads, **options: Any) -> Any:
    """vLLM's processor built on ``spec``'s folder while ``recorder`` is installed."""
    from transformers import AutoConfig
    from vllm.transformers_utils.processors.nano_nemotron_vl import NanoNemotronVLProcessor

    config = AutoConfig.from_pretrained(checkpoint_folder(spec), trust_remote_code=True)
    with recorder:
        return NanoNemotronVLProcessor(
            config, build_tokenizer(), max_model_len=spec.max_model_len, **options
        )


def _default() -> dict[str, Any]:
    return checkpoint_config(ModelSpec())


def test_the_processor_reads_the_tiling_fields_where_it_reads_them():
    recorder = ConfigReads()
    _processor(ModelSpec(), recorder)
    top = {r.field for r in recorder.reads if r.section == "config"}
    assert top >= PROCESSOR_READS, f"not recorded: {sorted(PROCESSOR_READS - top)}"
    sites = {r.site.split(":")[0] for r in recorder.reads if r.section == "config"}
    assert sites == {str(PROCESSOR_FILE)}, sites
    assert all(r.context == "" for r in recorder.reads)


def test_reads_by_other_code_are_not_recorded_and_the_recorder_uninstalls():
    from transformers import AutoConfig, PretrainedConfig

    saved = PretrainedConfig.__getattribute__
    config = AutoConfig.from_pretrained(checkpoint_folder(ModelSpec()), trust_remote_code=True)
    recorder = ConfigReads()
    with recorder:
        assert config.force_image_size == ModelSpec().image_size  # read by this test's file
        assert config.to_dict()["patch_size"] == 16
    assert not recorder.reads
    assert PretrainedConfig.__getattribute__ is saved


def test_a_dynamic_checkpoint_s_radio_arguments_are_recorded_by_key():
    recorder = ConfigReads()
    processor = _processor(ModelSpec(dynamic_resolution=True), recorder)
    assert processor.dynamic_tiler is not None
    keys = {r.field for r in recorder.reads if r.section == ARGS_SECTION}
    assert {"min_num_patches", "max_num_patches"} <= keys, keys


def test_an_ignored_field_reads_as_the_default_checkpoint_s_value():
    """A 32 px checkpoint read with ``force_image_size`` ignored tiles at the default's 64 px."""
    recorder = ConfigReads(ignore=("config", "force_image_size"), default_config=_default())
    processor = _processor(ModelSpec(image_size=32, audio=False), recorder)
    assert processor.image_size == ModelSpec().image_size != 32


def test_an_ignored_argument_the_default_lacks_reads_as_absent():
    """The default (static) checkpoint has no ``min_num_patches``: ignored, a dynamic checkpoint
    reads as static."""
    recorder = ConfigReads(ignore=(ARGS_SECTION, "min_num_patches"), default_config=_default())
    processor = _processor(ModelSpec(dynamic_resolution=True), recorder)
    assert processor.dynamic_tiler is None


def test_processor_options_are_recorded_with_their_values_and_can_be_ignored():
    recorder = ConfigReads()
    processor = _processor(ModelSpec(), recorder, max_num_tiles=2)
    assert processor.max_num_tiles == 2
    given = {(r.field, r.value) for r in recorder.reads if r.section == OPTION_SECTION}
    assert ("max_num_tiles", "2") in given, given

    ignoring = ConfigReads(ignore=(OPTION_SECTION, "max_num_tiles"), default_config=_default())
    assert _processor(ModelSpec(), ignoring, max_num_tiles=2).max_num_tiles == (
        DEFAULT_MAX_NUM_TILES
    )


def test_sections_are_named_by_model_type():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint_folder(ModelSpec()), trust_remote_code=True)
    assert [
        section_of(c)
        for c in (config, config.text_config, config.vision_config, config.sound_config)
    ] == ["config", "text_config", "vision_config", "sound_config"]


def test_a_field_to_ignore_must_name_a_checkpoint_section():
    assert parse_field("vision_config.args.min_num_patches") == (ARGS_SECTION, "min_num_patches")
    assert parse_field("text_config.n_groups") == ("text_config", "n_groups")
    with pytest.raises(pytest.UsageError, match=r"--ignore-config-field: .*'radio\.image_size'"):
        parse_field("radio.image_size")
    with pytest.raises(ConfigReadsError, match=r"ignore: .*got section 'derived RadioConfig'"):
        ConfigReads(ignore=("derived RadioConfig", "image_size"))
