"""The derived parity bounds (harness.oracles.bounds): the derivation against hand-computed
values, the statistics against hand-made rows, the table's validation, and the committed table
itself (every path calibrated, every bound below the analytic ceiling it replaces)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.oracles.bounds import (
    CALIBRATION_TABLE,
    MIN_SAMPLES,
    PARITY_PATHS,
    STATISTICS,
    cell_key,
    committed_table,
    derive_bound,
    error_statistics,
    parity_bounds,
    parity_path,
    parse_table,
    read_table,
)
from harness.oracles.parity import BF16_BOUND, rounding_ceiling


def test_the_bound_is_the_log_normal_quantile():
    # Ten samples of 0.01 and ten of 0.013: the logs' mean is -4.473990 and their sample
    # standard deviation 0.1345882; the normal quantile at 1 - 1e-6 is 4.753424; so the fit
    # gives exp(-4.473990 + 4.753424 * 0.1345882) = 0.021617, above 1.5 x 0.013 = 0.0195.
    bound = derive_bound([0.01] * 10 + [0.013] * 10, ceiling=BF16_BOUND)
    assert bound.value == pytest.approx(0.021617, rel=1e-4)
    assert bound.samples == 20
    assert bound.largest_sample == 0.013


def test_the_bound_is_never_below_a_margin_over_the_largest_sample():
    # Little spread: the fit is about 0.0103; 1.5 x the largest sample, 0.01545, wins.
    samples = [0.01] * 24 + [0.0103]
    assert derive_bound(samples, ceiling=BF16_BOUND).value == pytest.approx(0.01545)


def test_the_bound_is_never_above_the_analytic_ceiling():
    bound = derive_bound([0.01] * 10 + [0.05] * 10, ceiling=BF16_BOUND)
    assert bound.value == BF16_BOUND
    assert "capped at the analytic ceiling" in bound.method


def test_too_few_samples_keep_the_ceiling():
    bound = derive_bound([0.01] * (MIN_SAMPLES - 1), ceiling=BF16_BOUND)
    assert bound.value == BF16_BOUND
    assert f"{MIN_SAMPLES - 1} samples" in bound.method


def test_the_statistics_of_one_row_off():
    # Four rows of three ones (norm sqrt(12); the root-mean-square row sqrt(3), channel 2); the
    # first row 10 % too large. Row: 0.1 * sqrt(3) / sqrt(3) = 0.1. Global: 0.1 * sqrt(3) /
    # sqrt(12) = 0.05. Channel: each channel's error is 0.1, over 2: 0.05.
    expected = torch.ones(4, 3)
    actual = expected.clone()
    actual[0] *= 1.1
    stats = error_statistics(actual, expected)
    assert stats["global"] == pytest.approx(0.05, rel=1e-6)
    assert stats["row"] == pytest.approx(0.1, rel=1e-6)
    assert stats["channel"] == pytest.approx(0.05, rel=1e-6)


def test_the_statistics_of_one_channel_off():
    # Five rows of three ones (the root-mean-square row sqrt(3), channel sqrt(5)); the last
    # channel 20 % too large. Channel: 0.2 * sqrt(5) / sqrt(5) = 0.2. Row: 0.2 / sqrt(3) each.
    # Global: 0.2 * sqrt(5) / sqrt(15) = 0.2 / sqrt(3).
    expected = torch.ones(5, 3)
    actual = expected.clone()
    actual[:, 2] *= 1.2
    stats = error_statistics(actual, expected)
    assert stats["channel"] == pytest.approx(0.2, rel=1e-6)
    assert stats["row"] == pytest.approx(0.2 / 3**0.5, rel=1e-6)
    assert stats["global"] == pytest.approx(0.2 / 3**0.5, rel=1e-6)


def test_rows_of_two_shapes_are_refused():
    with pytest.raises(ValueError, match=r"expected rows of one shape, got \(2, 3\) and \(3, 3\)"):
        error_statistics(torch.ones(2, 3), torch.ones(3, 3))


#: Each catalogued form's tower items and the path they take (from the forms' checkpoint
#: variants: harness.inputs.catalogue).
FORM_PATHS = {
    "images-pil": ("image", False, "image-static"),
    "images-dynamic": ("image", False, "image-dynamic"),
    "images-mtp": ("image", False, "image-mtp"),
    "video-t1": ("video", False, "video-t1"),
    "videos-t2": ("video", False, "video-t2"),
    "video-evs-t1": ("video", False, "video-evs"),
    "videos-evs-t2": ("video", False, "video-evs-t2"),
    "audios": ("audio", False, "audio-hop-160"),
    "audios-hop-128": ("audio", False, "audio-hop-128"),
    "audios-no-conv-bias": ("audio", False, "audio-no-conv-bias"),
    "video-audio-in-video": ("audio", True, "audio-in-video"),
}


@pytest.mark.parametrize("form", sorted(FORM_PATHS))
def test_each_form_takes_its_path(form):
    modality, in_video, path = FORM_PATHS[form]
    assert parity_path(FORMS_BY_NAME[form].spec, modality, audio_in_video=in_video) == path


def test_an_unknown_modality_is_refused():
    with pytest.raises(ValueError, match="modality: expected image, video or audio, got 'text'"):
        parity_path(ModelSpec(), "text")


def _table(cells: object, **extra: object) -> dict[str, object]:
    return {"about": {}, "cells": cells, **extra}


@pytest.mark.parametrize(
    ("cells", "field"),
    [
        ({"nowhere | served-bfloat16 | saved-bfloat16": {}}, "cells['nowhere"),
        ({"connector | served-bfloat16": {}}, "cells['connector | served-bfloat16']"),
        (
            {
                "connector | served-bfloat16 | saved-bfloat16": {
                    "global": [-1.0],
                    "row": [],
                    "channel": [],
                }
            },
            "cells['connector | served-bfloat16 | saved-bfloat16'].global",
        ),
        (
            {
                "connector | served-bfloat16 | saved-bfloat16": {
                    "global": [0.1],
                    "row": [],
                    "channel": [],
                }
            },
            "as many samples of each statistic",
        ),
        ([], "cells: expected an object"),
    ],
)
def test_a_bad_table_is_refused_naming_the_field(cells, field):
    with pytest.raises(ValueError, match="expected") as caught:
        parse_table(_table(cells), "t.json")
    assert field in str(caught.value)
    assert str(caught.value).startswith("t.json: ")


def test_a_missing_table_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="run nemotron-vl-calibrate"):
        read_table(tmp_path / "parity.json")


def test_an_uncalibrated_cell_keeps_the_ceiling_and_says_why():
    key = cell_key("connector", "float16", "bfloat16")
    table = parse_table(_table({}, not_calibrated={key: "vllm fails the path"}), "t.json")
    bounds = table.bounds("connector", torch.float16, "bfloat16")
    assert all(bounds[s].value == rounding_ceiling(torch.float16) for s in STATISTICS)
    assert "vllm fails the path" in bounds.source


def test_an_unknown_path_is_refused():
    with pytest.raises(ValueError, match="path: expected one of"):
        parity_bounds("image-sideways", torch.bfloat16, "bfloat16")


# ---------------------------------------------------------------------------------------------
# The committed table


def test_the_committed_table_says_what_it_was_measured_on():
    about = json.loads(CALIBRATION_TABLE.read_text())["about"]
    for field in ("command", "target", "vllm", "harness", "torch", "weight_seeds"):
        assert about.get(field), f"{CALIBRATION_TABLE}: about.{field} is missing"


@pytest.mark.parametrize("path", sorted(PARITY_PATHS))
def test_every_path_is_calibrated_in_the_default_configuration(path):
    """Every path has a bf16 cell (a bf16 checkpoint served as saved: every check but the
    served-dtype ones), with enough samples; its global bound bites (below the single bound it
    replaces), and every bound sits above every sample it came from. A row or channel bound
    may stay at the ceiling where the samples' spread allows no less."""
    table = committed_table()
    cell = table.samples.get(cell_key(path, "bfloat16", "bfloat16"))
    assert cell is not None, f"{path}: no calibration samples; run nox -s calibrate"
    bounds = table.bounds(path, torch.bfloat16, "bfloat16")
    assert bounds["global"].value < BF16_BOUND / 1.5, bounds["global"].method
    for statistic in STATISTICS:
        bound = bounds[statistic]
        assert bound.samples >= MIN_SAMPLES, f"{path} {statistic}: {bound.samples} samples"
        assert bound.value <= BF16_BOUND, f"{path} {statistic}: {bound.method}"
        assert max(cell[statistic]) < bound.value, f"{path} {statistic}: {bound.method}"


def test_no_covering_array_variant_is_judged_by_the_ceiling():
    """Every variant's tower shape was calibrated: the default one by the committed table, each
    other by its own table, whose cells cover every path the default table calibrates in bf16,
    each with enough samples to derive its bounds."""
    from harness.checkpoints.pairs import covering_array
    from harness.oracles.bounds import (
        MIN_SAMPLES,
        committed_table,
        table_for_shape,
        tower_shape,
    )

    wanted = {
        key for key in committed_table().samples if key.endswith("served-bfloat16 | saved-bfloat16")
    }
    default = tower_shape(ModelSpec())
    for spec in covering_array():
        table = table_for_shape(spec)
        assert table.samples, f"{spec.slug}: {table.uncalibrated}"
        if tower_shape(spec) == default:
            assert table is committed_table()
            continue
        assert table.about["shape"] == tower_shape(spec)
        missing = sorted(wanted - set(table.samples))
        assert not missing, f"{spec.slug}: not calibrated: {missing} ({table.not_calibrated})"
        assert all(len(cell["global"]) >= MIN_SAMPLES for cell in table.samples.values())
    other = table_for_shape(ModelSpec(image_size=48))
    assert "a tower shape no calibration measured (image48-" in other.uncalibrated
