"""The covering array of checkpoint variants: every allowed pair of option values in some
variant (checked by brute force, not by the library that built it), a CPU run covering every
pair of what a CPU builds, and its size bounded."""

from __future__ import annotations

import itertools

import pytest

from harness.checkpoints.pairs import (
    AXES,
    ISOLATED,
    MAX_VARIANTS,
    allowed,
    covering_array,
    isolated,
    uncovered_pairs,
)
from harness.checkpoints.spec import OTHER_SOUND_SIZES, OTHER_TEXT_SIZES, ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME, forms_for
from harness.plugin.config_reads import checkpoint_config


def test_every_allowed_pair_of_values_is_in_some_variant():
    assert uncovered_pairs(covering_array()) == []


def test_the_check_of_the_pairs_sees_a_missing_one():
    """Without its first variant the array misses pairs: the brute-force check can fail."""
    assert uncovered_pairs(covering_array()[1:])
    assert uncovered_pairs([ModelSpec()]) != []


def test_the_main_variants_alone_cover_every_pair_of_the_values_not_isolated():
    """The variants with no ISOLATED value (those a CPU vLLM builds and serves without a known
    failure hiding the rest) alone hold every pair of the other values."""
    on_cpu = [s for s in covering_array() if not isolated(s)]
    assert len(on_cpu) >= 4
    values = {
        a: [v for v in vs if ISOLATED.get(a, (object(), ""))[0] != v] for a, vs in AXES.items()
    }
    for (a, xs), (b, ys) in itertools.combinations(values.items(), 2):
        for x, y in itertools.product(xs, ys):
            assert any(getattr(s, a) == x and getattr(s, b) == y for s in on_cpu), (a, x, b, y)


def test_the_number_of_builds_is_bounded():
    """At least the 4 variants 21 binary axes need (2 x 2 for any two of them), at most
    MAX_VARIANTS; each distinct."""
    variants = covering_array()
    assert 4 <= len(variants) <= MAX_VARIANTS
    assert len(set(variants)) == len(variants)
    assert len({s.slug for s in variants}) == len(variants)


def test_the_array_is_the_same_every_time():
    assert covering_array.__wrapped__() == covering_array()


def test_only_buildable_combinations_are_asked_for():
    assert not allowed(["omni", False, True, 1, False, 160, 64, True, "fp8"])
    assert allowed(["v2", False, True, 1, False, 160, 64, True, "fp8"])
    for spec in covering_array():
        assert not (spec.language_model == "omni" and spec.quantization == "fp8")


def test_a_variant_without_audio_serves_no_audio_form():
    names = {f.name for f in forms_for(ModelSpec(audio=False))}
    assert "audios" not in names
    assert "video-audio-in-video" not in names
    assert "images-pil" in names
    assert {f.name for f in forms_for(ModelSpec())} == set(FORMS_BY_NAME)
    assert [f.name for f in forms_for(ModelSpec(), ["mixed", "audios"])] == ["audios", "mixed"]
    with pytest.raises(KeyError, match=r"names: not catalogued request forms: \['nope'\]"):
        forms_for(ModelSpec(), ["nope"])


@pytest.mark.parametrize(
    ("axis", "section", "sizes"),
    [
        ("text_sizes", "text_config", OTHER_TEXT_SIZES),
        ("sound_sizes", "sound_config", OTHER_SOUND_SIZES),
    ],
)
def test_the_other_sizes_change_every_size_they_name_in_the_written_config(axis, section, sizes):
    """A field the "other" sizes leave at the default's value would stay in no variant: each
    differs from the default variant's in the ``config.json`` the folder holds, and nothing
    else in that section moves."""
    default = checkpoint_config(ModelSpec())[section]
    other = checkpoint_config(ModelSpec(**{axis: "other"}))[section]
    changed = {k for k in other if other[k] != default.get(k)}
    assert changed == set(sizes), changed ^ set(sizes)


def test_another_size_name_is_refused_naming_the_field():
    with pytest.raises(
        ValueError, match=r"ModelSpec.text_sizes: expected one of \['default', 'other'\], got 'big'"
    ):
        ModelSpec(text_sizes="big")  # type: ignore[arg-type]


def test_an_embeddings_request_is_as_wide_as_the_variant_it_is_sent_to():
    form = FORMS_BY_NAME["image-embeds-list"]
    assert form.request_for(ModelSpec()) is form.request
    wide = form.request_for(ModelSpec(hidden_size=96))
    assert [e.shape for e in wide.images] == [(3, 96), (7, 96)]
    assert wide.prompt == form.request.prompt
