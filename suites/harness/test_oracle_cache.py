"""The oracle's answers kept on disk (:mod:`harness.oracles.cache`): one key per request, variant,
serving configuration, reference code and library versions; an answer read back equals the one
computed; a run whose answers are all kept loads no reference model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.media import pil_image
from harness.inputs.requests import Request
from harness.oracles.cache import (
    ORACLE_CACHE_ENV,
    OracleCache,
    Undescribed,
    answered,
    oracle_fingerprint,
    request_digest,
)
from harness.targets.reference.target import ReferenceTarget


def test_a_request_s_digest_follows_its_content():
    image = pil_image(60, 50, 1)
    request = Request("Look: <image>.", images=[image])
    assert request_digest(request) == request_digest(Request("Look: <image>.", images=[image]))
    different = [
        Request("Look: <image>!", images=[image]),  # the text
        Request("Look: <image>.", images=[pil_image(60, 50, 2)]),  # the pixels
        Request("Look: <image>.", images=[np.asarray(image)]),  # the form: an array
        Request("Look: <image>.", images=[image], max_num_tiles=2),  # a request option
    ]
    digests = {request_digest(r) for r in [request, *different]}
    assert len(digests) == 1 + len(different)
    embeddings = torch.ones(2, 4)
    assert request_digest(embeddings) != request_digest(embeddings.to(torch.bfloat16))
    assert request_digest(ModelSpec()) != request_digest(ModelSpec(max_num_tiles=2))
    # A serving configuration's label names it; it is not part of what it is.
    assert request_digest(ServingConfig(label="a")) == request_digest(ServingConfig(label="b"))


def test_a_value_the_digest_cannot_describe_is_named():
    with pytest.raises(Undescribed, match="no description of a object"):
        request_digest(Request("x", images=[object()]))


def test_an_answer_is_computed_once_and_read_back(tmp_path):
    cache = OracleCache(tmp_path)
    before = answered()
    calls: list[int] = []

    def compute() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"rows": torch.arange(6.0).reshape(2, 3)}

    first = cache.answer("q", (ModelSpec(), "request"), compute)
    again = OracleCache(tmp_path).answer("q", (ModelSpec(), "request"), compute)
    assert len(calls) == 1
    assert torch.equal(first["rows"], again["rows"])
    cache.answer("q", (ModelSpec(max_num_tiles=2), "request"), compute)  # another variant
    cache.answer("other question", (ModelSpec(), "request"), compute)
    assert len(calls) == 3
    after = answered()
    assert {k: after[k] - before[k] for k in after} == {"hits": 1, "misses": 3, "uncached": 0}


def test_a_torn_answer_is_computed_again(tmp_path):
    cache = OracleCache(tmp_path)
    cache.answer("q", ("request",), lambda: 1)
    (kept,) = tmp_path.rglob("*.pt")
    kept.write_bytes(b"not a torch file")
    assert cache.answer("q", ("request",), lambda: 2) == 2
    assert OracleCache(tmp_path).answer("q", ("request",), lambda: 3) == 2


def test_answers_of_other_code_are_dropped_when_one_is_kept(tmp_path):
    older = tmp_path / "0123456789abcdef" / "ab"
    older.mkdir(parents=True)
    (older / "ab.pt").write_bytes(b"")
    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    OracleCache(tmp_path).answer("q", ("request",), lambda: 1)
    assert not older.parent.exists()
    assert unrelated.exists()
    assert len(list(tmp_path.rglob("*.pt"))) == 1


def test_an_exception_is_not_kept(tmp_path):
    cache = OracleCache(tmp_path)

    def refuse() -> int:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        cache.answer("q", ("request",), refuse)
    assert not list(tmp_path.rglob("*.pt"))


def test_the_environment_names_the_folder_or_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv(ORACLE_CACHE_ENV, "off")
    assert OracleCache.from_environment() is None
    monkeypatch.setenv(ORACLE_CACHE_ENV, str(tmp_path))
    cache = OracleCache.from_environment()
    assert cache is not None
    assert cache.folder == tmp_path


def test_the_fingerprint_is_of_the_reference_s_code(monkeypatch):
    """A change to a file the reference computes with is another fingerprint."""
    import harness.oracles.cache as module

    before = oracle_fingerprint()
    monkeypatch.setattr(module, "ORACLE_LIBRARIES", (*module.ORACLE_LIBRARIES, "pytest"))
    oracle_fingerprint.cache_clear()
    try:
        assert oracle_fingerprint() != before
    finally:
        oracle_fingerprint.cache_clear()


def test_kept_answers_equal_computed_ones_and_load_no_model(tmp_path):
    """The reference as an oracle with kept answers: the second target answers the same request
    from the cache, equal to what the first computed, without loading the checkpoint."""
    form = FORMS_BY_NAME["mixed"]
    cpu = torch.device("cpu")
    computed = ReferenceTarget(answers=OracleCache(tmp_path)).model(form.spec, cpu)
    expected = computed.run_request(form.request)
    expected_features = computed.request_features(form.request)
    kept = ReferenceTarget(answers=OracleCache(tmp_path)).model(form.spec, cpu)
    got = kept.run_request(form.request)
    got_features = kept.request_features(form.request)
    assert kept._loaded is None, "a kept answer loaded the reference model"
    assert got.prompt_token_ids == expected.prompt_token_ids
    assert got.items == expected.items
    assert got.batches == expected.batches
    for a, b in zip(got.embeddings, expected.embeddings, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(got_features, expected_features, strict=True):
        assert dataclasses.astuple(a)[:2] == dataclasses.astuple(b)[:2]
        assert all(torch.equal(a.tensors[k], b.tensors[k]) for k in b.tensors)
    plain = ReferenceTarget().model(form.spec, cpu).run_request(form.request)
    for a, b in zip(plain.embeddings, expected.embeddings, strict=True):
        assert torch.equal(a, b)
