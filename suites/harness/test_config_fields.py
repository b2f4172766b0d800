"""The config-field inventory's table: each recorded field's values, the variants that set
another value, its verdict, and the report; and one field ignored for real (the plugin option on
a check of the suites, against vLLM)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from harness.checkpoints.spec import ModelSpec
from harness.mutation.config_fields import (
    ABSENT,
    PUBLISHED_NAMES,
    REASONS,
    REPORT_STEM,
    FieldReason,
    FieldRow,
    ReasonsFileError,
    build_report,
    build_rows,
    explain,
    load_reasons,
    modules_of,
    published_configs,
    render_markdown,
    value_in,
)
from harness.plugin.config_reads import checkpoint_config
from suites.harness.helpers import ROOT, needs_vllm, run_forked


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
    field only it sets is told apart from one a check could catch. A check that ran on the
    variant counts only if it read the field (the V2 language model's checks never read the MoE
    sizes that ``text_sizes="other"`` sets)."""
    omni = ModelSpec(language_model="omni")
    field = _field("text_config", "routed_scaling_factor")
    field["checks"].append("suites/conformance/test_w.py::test_omni")
    recorded = _recorded([field], [ModelSpec(), omni])
    recorded["variants"][1]["checks"] = [
        "suites/conformance/test_w.py::test_omni",
        "suites/conformance/test_w.py::test_text",
    ]
    ran = {"suites/conformance/test_a.py::test_b", "suites/conformance/test_w.py::test_text"}
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


def _row(field: str, variants: list[str]) -> FieldRow:
    return FieldRow(
        section="text_config",
        field=field,
        sites=["vllm/model_executor/models/nemotron_h.py:1"],
        checks=["suites/conformance/test_a.py::test_b"],
        published={PUBLISHED_NAMES[0]: 1e-5, PUBLISHED_NAMES[1]: 1e-5},
        default=1e-5,
        values_seen=[],
        variants=variants,
    )


def test_a_field_no_variant_sets_takes_its_entry_s_reason_and_stale_entries_are_named():
    rows = [_row("layer_norm_epsilon", []), _row("head_dim", ["v2-lm-other-sizes"])]
    reasons = {
        "text_config.layer_norm_epsilon": FieldReason(
            "text_config.layer_norm_epsilon", "forward", "the forward pass's norms"
        ),
        "text_config.head_dim": FieldReason("text_config.head_dim", "option", "no variant yet"),
        "text_config.gone": FieldReason("text_config.gone", "absent", "renamed"),
    }
    stale = explain(rows, reasons)
    assert [r.verdict for r in rows] == ["no variant, explained", "not caught"]
    assert stale == [
        "text_config.gone: no longer read",
        "text_config.head_dim: set by 1 variant(s)",
    ]
    report = build_report(rows, {"vllm": "0.33.0"}, stale)
    assert report["verdicts"] == {"no variant, explained": 1, "not caught": 1}
    text = render_markdown(json.loads(json.dumps(report)))
    assert "| forward: the forward pass's norms | no variant, explained |" in text
    assert "- text_config.head_dim: set by 1 variant(s)" in text
    # A row whose entry went stale is no longer explained.
    assert explain(rows, {}) == []
    assert rows[0].verdict == "no variant"


def test_an_inert_entry_explains_a_field_variants_set_that_no_check_catches():
    """An ``inert`` entry: for a field some variant sets whose ignore run failed no check; it
    is stale for a field no variant sets, or one a check catches."""
    inert, unset, caught = (
        _row("use_cache", ["v2-a"]),
        _row("layer_norm_epsilon", []),
        _row("head_dim", ["v2-b"]),
    )
    for row in (inert, caught):
        row.ignored_checks = ["suites/conformance/test_a.py::test_b"]
    caught.caught_by = ["suites/conformance/test_a.py::test_b"]
    reasons = {
        f"text_config.{row.field}": FieldReason(f"text_config.{row.field}", "inert", "unused")
        for row in (inert, unset, caught)
    }
    stale = explain([inert, unset, caught], reasons)
    assert [r.verdict for r in (inert, unset, caught)] == [
        "no effect, explained",
        "no variant",
        "caught",
    ]
    assert stale == [
        "text_config.head_dim: inert, but 1 check(s) fail when it is ignored",
        "text_config.layer_norm_epsilon: inert, but no variant sets it",
    ]
    text = render_markdown(json.loads(json.dumps(build_report([inert], {}, []))))
    assert "| inert: unused (0 of 1 failed) | no effect, explained |" in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[field]]\nname = "a.b"\nreason = "because"\nwhy = "x"\n', "reason: expected one of"),
        ('[[field]]\nname = "ab"\nreason = "fixed"\nwhy = "x"\n', "name: expected 'SECTION.FIELD'"),
        ('[[field]]\nname = "a.b"\nreason = "fixed"\n', "expected the keys"),
        ('[[field]]\nname = "a.b"\nreason = "fixed"\nwhy = 3\n', "every value must be a string"),
        ('[[fields]]\nname = "a.b"\n', "expected only [[field]] tables"),
        ("[[field]\n", "not valid TOML"),
        (
            '[[field]]\nname = "a.b"\nreason = "fixed"\nwhy = "x"\n' * 2,
            "field #2: name: 'a.b' has an entry already",
        ),
    ],
)
def test_a_malformed_reasons_file_is_refused_naming_the_entry(tmp_path, text, message):
    path = tmp_path / "config_fields.toml"
    path.write_text(text)
    with pytest.raises(ReasonsFileError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_reasons(path)


def test_every_committed_reason_explains_a_field_of_the_committed_inventory():
    """``fixtures/config_fields.toml`` against ``reports/config-fields.json``: each entry names a
    field the recorded run read and no variant set (none stale), with one of REASONS; and every
    field the report leaves unexplained is one some variant sets (the report says "no variant"
    only for a field no entry covers)."""
    reasons = load_reasons()
    assert reasons
    assert all(r.reason in REASONS and r.why for r in reasons.values())
    report = json.loads((ROOT / "reports" / f"{REPORT_STEM}.json").read_text())
    names = {f.name for f in dataclasses.fields(FieldRow)}
    rows = [FieldRow(**{k: v for k, v in r.items() if k in names}) for r in report["fields"]]
    assert explain(rows, reasons) == []
    assert report["stale_reasons"] == []
    assert [r.name for r in rows if r.verdict == "no variant"] == []


def test_an_ignore_run_runs_whole_modules():
    assert modules_of(["suites/a.py::x[1]", "suites/a.py::y", "suites/b.py::z", "(outside)"]) == [
        "suites/a.py",
        "suites/b.py",
    ]


@needs_vllm
@pytest.mark.slow
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
    done = run_forked(
        [
            f"{PAIRWISE_CHECK}[{spec.slug}]",
            "--target=vllm",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--record-config-reads={out}",
            "--ignore-config-field=config.use_thumbnail",
        ],
        timeout_s=300,
    )
    assert out.exists(), done.stdout[-3000:]
    assert done.returncode == 1, "the variant passed with the thumbnail ignored"
    # pytest's summary line (the errors' lines share the output and may follow it).
    (summary,) = re.findall(r"^\d+ (?:failed|passed)\b.* in [\d.]+s", done.stdout, re.M)
    assert summary.startswith("1 failed"), done.stdout[-3000:]
    recorded = json.loads(out.read_text())
    assert recorded["ignored"] == "config.use_thumbnail"
    reads = {(f["section"], f["field"]) for f in recorded["fields"]}
    assert ("config", "use_thumbnail") in reads
    assert [v["slug"] for v in recorded["variants"]] == [spec.checkpoint.slug]


@needs_vllm
@pytest.mark.slow
def test_a_build_s_reads_count_for_every_check_that_uses_the_model(tmp_path):
    """The model is built in the first check that asks for it and shared: the fields its
    constructor reads count for the later checks too (else an ignore run leaves them out, and a
    field only they would catch reads as not caught)."""
    first, second = (
        f"suites/conformance/test_parity.py::test_request_matches_the_reference[{name}]"
        for name in ("images-pil", "images-array")
    )
    out = tmp_path / "reads.json"
    done = run_forked(
        [first, second, "--target=vllm", "-p", "no:cacheprovider", f"--record-config-reads={out}"],
        timeout_s=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    recorded = json.loads(out.read_text())
    # Read once, by the constructor (nano_nemotron_vl.py), while the first check built it.
    (ps_version,) = (f for f in recorded["fields"] if f["field"] == "ps_version")
    assert {first, second} <= set(ps_version["checks"])
    (variant,) = recorded["variants"]
    assert {first, second} <= set(variant["checks"])
