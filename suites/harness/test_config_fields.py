"""The config-field inventory's table: each recorded field's values, the variants that set
another value, its verdict, and the report; and one field ignored for real (the plugin option on
a check of the suites, against vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from harness.checkpoints.spec import ModelSpec
from harness.mutation.config_fields import (
    ABSENT,
    PUBLISHED_NAMES,
    FieldRow,
    build_report,
    build_rows,
    modules_of,
    published_configs,
    render_markdown,
    value_in,
)
from harness.plugin.config_reads import checkpoint_config
from suites.harness.helpers import ROOT, needs_vllm


def _recorded(fields: list[dict[str, Any]], variants: list[ModelSpec]) -> dict[str, Any]:
    return {
        "fields": fields,
        "checks": [],
        "variants": [
            {"slug": s.slug, "config": checkpoint_config(s), "checks": []} for s in variants
        ],
    }


def _field(section: str, name: str, values: list[str] | None = None) -> dict[str, Any]:
    return {
        "section": section,
        "field": name,
        "sites": ["vllm/x.py:1"],
        "checks": ["suites/conformance/test_a.py::test_b"],
        "values": values or [],
    }


def test_published_values_are_the_architecture_brief_s():
    """Sizes the brief gives (``architecture.md`` §1.1-1.3): 512 px tiles of 16 px patches in
    both; the 12B VL's language model is 5120 wide with ``mamba_head_dim`` 80."""
    twelve_b, omni = (published_configs()[name] for name in PUBLISHED_NAMES)
    for config in (twelve_b, omni):
        assert value_in(config, "config", "force_image_size") == 512
        assert value_in(config, "config", "patch_size") == 16
        assert value_in(config, "vision_config.args", "model") == "vit_huge_patch16_224"
    assert value_in(twelve_b, "text_config", "hidden_size") == 5120
    assert value_in(twelve_b, "text_config", "mamba_head_dim") == 80
    assert value_in(twelve_b, "sound_config", "hop_length") is ABSENT  # no audio tower
    assert value_in(omni, "vision_config", "video_temporal_patch_size") == 2


def test_a_field_is_set_by_the_variants_whose_config_holds_another_value():
    recorded = _recorded(
        [
            _field("vision_config", "video_temporal_patch_size"),
            _field("sound_config", "hop_length"),
            _field("config", "patch_size"),
            _field("vision_config.args", "min_num_patches"),
            _field("derived RadioConfig", "image_size"),
            _field("config", "vision_config"),
            _field("sound_config", "return_dict"),
        ],
        [
            ModelSpec(),
            ModelSpec(video_temporal_patch_size=2),
            ModelSpec(audio=False),  # no sound_config: sets no hop length
            ModelSpec(dynamic_resolution=True),
        ],
    )
    rows = {r.name: r for r in build_rows(recorded, published_configs())}
    t2, dynamic = ModelSpec(video_temporal_patch_size=2).slug, ModelSpec(dynamic_resolution=True)
    assert rows["vision_config.video_temporal_patch_size"].variants == [t2]
    assert rows["vision_config.video_temporal_patch_size"].default == 1
    assert rows["sound_config.hop_length"].variants == []
    assert rows["vision_config.args.min_num_patches"].default is ABSENT
    assert rows["vision_config.args.min_num_patches"].variants == [dynamic.slug]
    verdicts = {name: row.verdict for name, row in rows.items()}
    assert verdicts == {
        "vision_config.video_temporal_patch_size": "not caught",  # no ignore run yet
        "sound_config.hop_length": "no variant",
        "config.patch_size": "no variant",
        "vision_config.args.min_num_patches": "not caught",
        "derived RadioConfig.image_size": "derived",
        "config.vision_config": "a section",
        "sound_config.return_dict": "bookkeeping",
    }


def test_a_field_only_variants_no_check_ran_on_set_needs_cuda():
    """The Omni language model is built only by a CUDA vLLM: its checks skip on a CPU, and a
    field only it sets is told apart from one a check could catch."""
    omni = ModelSpec(language_model="omni")
    recorded = _recorded([_field("text_config", "routed_scaling_factor")], [ModelSpec(), omni])
    recorded["variants"][1]["checks"] = ["suites/conformance/test_w.py::test_omni"]
    ran = {"suites/conformance/test_a.py::test_b"}
    (row,) = build_rows(recorded, published_configs(), ran)
    assert row.variants == [omni.slug]
    assert row.verdict == "variant needs CUDA"
    (row,) = build_rows(
        recorded, published_configs(), ran | {"suites/conformance/test_w.py::test_omni"}
    )
    assert row.verdict == "not caught"


def test_a_processor_option_is_set_when_some_request_gives_another_value():
    recorded = _recorded(
        [
            _field("processor option", "max_num_tiles", ["2", "None"]),
            _field("processor option", "use_audio_in_video", ["False"]),
        ],
        [ModelSpec()],
    )
    rows = {r.name: r for r in build_rows(recorded, published_configs())}
    assert rows["processor option.max_num_tiles"].variants == ["2"]
    assert rows["processor option.use_audio_in_video"].verdict == "no variant"


def test_the_report_has_a_row_per_field_with_its_catchers():
    row = FieldRow(
        section="vision_config",
        field="video_temporal_patch_size",
        sites=["vllm/model_executor/models/nano_nemotron_vl.py:1"],
        checks=["suites/conformance/test_a.py::test_b"],
        published={PUBLISHED_NAMES[0]: 1, PUBLISHED_NAMES[1]: 2},
        default=1,
        values_seen=[],
        variants=["v2-static-audio-t2"],
        ignored_checks=["suites/conformance/test_a.py::test_b", "suites/conformance/test_a.py::c"],
        caught_by=["suites/conformance/test_a.py::test_b"],
    )
    report = build_report([row], {"vllm": "0.33.0"})
    assert report["verdicts"] == {"caught": 1}
    text = render_markdown(json.loads(json.dumps(report)))
    assert (
        "| `vision_config.video_temporal_patch_size` | `nano_nemotron_vl.py:1` | `1` | `2` | `1` "
        "| `v2-static-audio-t2` | 1 of 2: `test_b` | caught |"
    ) in text


def test_an_ignore_run_runs_whole_modules():
    assert modules_of(["suites/a.py::x[1]", "suites/a.py::y", "suites/b.py::z", "(outside)"]) == [
        "suites/a.py",
        "suites/b.py",
    ]


@needs_vllm
def test_ignoring_the_thumbnail_fails_a_variant_of_the_covering_array(tmp_path):
    """No hand-picked variant turns the thumbnail off; the covering array's variants that do
    serve the catalogue as the reference does (the vLLM suites' run), and one of them fails when
    every read of ``use_thumbnail`` sees the default's True, as if vLLM ignored the field."""
    from harness.checkpoints.pairs import covering_array, isolated
    from harness.jobs.report import PAIRWISE_CHECK

    # Static tiles (the thumbnail is static tiling's), built and served on a CPU.
    spec = next(
        s for s in covering_array() if not (s.use_thumbnail or s.dynamic_resolution or isolated(s))
    )
    out = tmp_path / "reads.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"{PAIRWISE_CHECK}[{spec.slug}]",
            "--target=vllm",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--record-config-reads={out}",
            "--ignore-config-field=config.use_thumbnail",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 1, "the variant passed with the thumbnail ignored"
    assert "1 failed" in done.stdout.splitlines()[-1], done.stdout[-3000:]
    recorded = json.loads(out.read_text())
    assert recorded["ignored"] == "config.use_thumbnail"
    reads = {(f["section"], f["field"]) for f in recorded["fields"]}
    assert ("config", "use_thumbnail") in reads
    assert [v["slug"] for v in recorded["variants"]] == [spec.checkpoint.slug]
