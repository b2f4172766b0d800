"""The processing metadata an engine asks before or between requests.

Asked of the target's real processing info for the checkpoint folder (vLLM: the processor its
registry makes), with one shared fast tokenizer. Every entry point must answer without
constructing the processor (vLLM PR #38655: a processor built in such a path tokenizes with the
shared tokenizer while requests use it), and answer what the architecture says:

- video always, audio when the checkpoint has a ``sound_config``; the dynamic tiler when it has
  dynamic resolution;
- no per-prompt limit of the model's own for the modalities it has, none for others;
- the data parser checks precomputed embeddings against ``text_config.hidden_size``;
- the fields config routes every keyword the model reads (routing keys and their helpers,
  ``video_embeds`` included) with its modality;
- the most tokens an image can take: static tiles, ``(max_num_tiles + thumbnail) x tokens per
  tile``; dynamic resolution, ``max_num_patches / shuffle^2``; a video or an audio clip, at most
  the sequence.
"""

from __future__ import annotations

import pytest

from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import VIDEO_ASPECT
from reference_impl.tokenizer import build_tokenizer

pytestmark = pytest.mark.concern("metadata")

SEQ_LEN = 4096
STATIC = ModelSpec()
DYNAMIC_NO_AUDIO = ModelSpec(dynamic_resolution=True, audio=False)
SPECS = {
    "static-audio": STATIC,
    "dynamic-no-audio": DYNAMIC_NO_AUDIO,
    "video-target-patches": VIDEO_ASPECT,
}
ROUTED = {
    "image": ("pixel_values_flat", "image_num_patches", "image_embeds"),
    "video": (
        "pixel_values_flat_video",
        "video_num_patches",
        "frames_indices",
        "frame_duration_ms",
        "video_embeds",
    ),
    "audio": ("input_audio_features", "feature_attention_mask", "audio_num_clips"),
}
ENTRY_POINTS = (
    "supports_video",
    "supports_audio",
    "is_dynamic_tiler",
    "supported_limits",
    "embedding_width",
    "routed_keys",
    "max_tokens_per_item",
)


def ask(metadata, entry_point):
    if entry_point == "max_tokens_per_item":
        counts = {"image": 1, "video": 1} | ({"audio": 1} if metadata.supports_audio() else {})
        return metadata.max_tokens_per_item(SEQ_LEN, counts)
    return getattr(metadata, entry_point)()


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_answered_without_constructing_the_processor(target, spec, entry_point):
    metadata = target.metadata(spec, build_tokenizer())  # a new one: its count starts at 0
    ask(metadata, entry_point)
    assert metadata.constructions == 0, (
        f"{entry_point} constructed the processor {metadata.constructions} times"
    )


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_modalities_and_limits(target, spec):
    metadata = target.metadata(spec, build_tokenizer())
    assert metadata.supports_video() is True
    assert metadata.supports_audio() is spec.audio
    assert metadata.is_dynamic_tiler() is spec.dynamic_resolution
    expected = {"image": None, "video": None} | ({"audio": None} if spec.audio else {})
    assert metadata.supported_limits() == expected


def test_the_data_parser_checks_embedding_width(target):
    width = target.metadata(STATIC, build_tokenizer()).embedding_width()
    assert width == STATIC.hidden_size, (
        f"embeddings checked against width {width}, the language model's is {STATIC.hidden_size}"
    )


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_the_fields_config_routes_every_model_input(target, spec):
    routed = target.metadata(spec, build_tokenizer()).routed_keys()
    wrong = {
        key: routed.get(key, "not routed")
        for modality, keys in ROUTED.items()
        if modality != "audio" or spec.audio
        for key in keys
        if routed.get(key) != modality
    }
    assert not wrong, f"model inputs the fields config does not route to their modality: {wrong}"


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_max_tokens_per_item(target, spec):
    config = spec.vl_config()
    metadata = target.metadata(spec, build_tokenizer())
    answer = ask(metadata, "max_tokens_per_item")
    if spec.dynamic_resolution:
        image = config.max_num_patches // round(1 / config.downsample_ratio) ** 2
    else:
        tiles = config.max_num_tiles + (1 if config.use_thumbnail else 0)
        image = tiles * spec.tokens_per_tile
    assert answer["image"] == image, f"an image takes at most {image} tokens, got {answer}"
    for modality in ("video", "audio") if spec.audio else ("video",):
        assert 1 <= answer[modality] <= SEQ_LEN, f"{modality}: {answer[modality]}"


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("asked", ["image", "video", "audio", "image+video", "none"])
def test_max_tokens_per_item_answers_only_the_modalities_asked(target, spec, asked):
    """The engine asks with a count for every modality, 0 for those a request may not carry
    (a limit of 0): the answer names exactly the modalities with a count above 0."""
    supported = ["image", "video", "audio"] if spec.audio else ["image", "video"]
    wanted = {m for m in asked.split("+") if m in supported}
    counts = {m: (1 if m in wanted else 0) for m in supported}
    answer = target.metadata(spec, build_tokenizer()).max_tokens_per_item(SEQ_LEN, counts)
    assert set(answer) == wanted, f"asked with counts {counts}, answered for {sorted(answer)}"


#: Variants and the tokens of one tubelet of their profiling video (square frames a tile wide,
#: 64 px): a tile's 4 x 4 patches, 2 x 2 tokens; with a target of 36 patches, the frame's aspect
#: 1 gives 6 x 6 patches, 3 x 3 tokens.
PROFILED = {
    "t1": (ModelSpec(), 4),
    "t2": (ModelSpec(video_temporal_patch_size=2), 4),
    "video-target-patches": (VIDEO_ASPECT, 9),
}
COUNTS = {
    "one-video": {"video": 1},
    "image-video": {"image": 1, "video": 1},
    "2-3": {"image": 2, "video": 3},
}


@pytest.mark.parametrize("counts", COUNTS.values(), ids=COUNTS.keys())
@pytest.mark.parametrize(("spec", "per_tubelet"), PROFILED.values(), ids=PROFILED.keys())
def test_the_profiling_videos_take_what_the_images_leave(target, spec, per_tubelet, counts):
    """The engine profiles memory with a dummy request at the context's limit (vLLM PR #38727's
    class: a budget that disagrees with what the processor produces): each image at its most
    tokens ((max_num_tiles + thumbnail) x tokens per tile), the rest of the context shared
    equally among the videos in whole tubelets of T frames, each a square frame's tokens, at
    least one frame. A modality missing from the counts counts 0."""
    config = spec.vl_config()
    tiles = config.max_num_tiles + (1 if config.use_thumbnail else 0)
    image_tokens = counts.get("image", 0) * tiles * spec.tokens_per_tile
    tubelets = (SEQ_LEN - image_tokens) // per_tubelet // counts["video"]
    expected = max(tubelets * spec.video_temporal_patch_size, 1)
    frames = target.metadata(spec, build_tokenizer()).profiling_video_frames(SEQ_LEN, counts)
    assert frames == expected, (
        f"{counts} in {SEQ_LEN} tokens: expected {expected} frames per video "
        f"({image_tokens} image tokens, {per_tubelet} per tubelet of "
        f"{spec.video_temporal_patch_size}), got {frames}"
    )
