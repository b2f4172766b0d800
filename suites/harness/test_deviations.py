"""Known deviations: the file format, strict-xfail application, and the committed files."""

from __future__ import annotations

import functools

import pytest

from harness.jobs.deviations import (
    DEVIATIONS_DIR,
    REACHES,
    Deviation,
    DeviationFileError,
    describe,
    load_deviations,
)
from suites.harness.helpers import run_forked, run_suites

CHECK = "suites/conformance/test_passthrough.py::test_the_upstream_reproducer"
PIN = "raises = 'ValueError'\nmatch = 'x'\nreach = 'request'\n"


def entry(check, reason="because", raises="ValueError", match="x", reach="request"):
    return (
        f"[[deviation]]\ncheck = '{check}'\nreason = '{reason}'\n"
        f"raises = '{raises}'\nmatch = '''{match}'''\nreach = '{reach}'\n"
    )


def write(tmp_path, text):
    path = tmp_path / "deviations.toml"
    path.write_text(text)
    return path


def test_load_entries(tmp_path):
    path = write(tmp_path, entry(CHECK, match="^data"))
    deviation = load_deviations(path)[CHECK]
    assert (deviation.reason, deviation.raises, deviation.match) == (
        "because",
        "ValueError",
        "^data",
    )


def test_one_cause_may_show_as_several_exception_types(tmp_path):
    """Unpacking an embedding's rows as (video, metadata) raises ValueError or IndexError
    depending on the row count: one cause, pinned once."""
    path = write(tmp_path, entry(CHECK, raises="IndexError | ValueError", match="^bad"))
    deviation = load_deviations(path)[CHECK]
    assert deviation.cause_of(ValueError("bad rows")) is None
    assert deviation.cause_of(IndexError("bad index")) is None
    assert deviation.cause_of(ExceptionGroup("g", [ValueError("bad"), IndexError("bad")])) is None
    assert "expected IndexError | ValueError" in str(deviation.cause_of(TypeError("bad")))
    assert deviation.cause_of(ValueError("other")) is not None


def test_missing_file_means_no_deviations(tmp_path):
    assert load_deviations(tmp_path / "absent.toml") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[[deviation]]\ncheck = 'a::b'\nreason = 'r'\n",
            r"expected the keys \['check', 'match', 'raises', 'reach', 'reason'\]",
        ),
        ("[[deviation]]\ncheck = 'nope'\nreason = 'r'\n" + PIN, "check: expected a test id"),
        ("[[deviation]]\ncheck = 'a::b'\nreason = ' '\n" + PIN, "reason: expected a non-empty"),
        (entry("a::b", raises="not a name"), "raises: expected an exception type's name"),
        (entry("a::b", raises="ValueError |"), "raises: expected an exception type's name"),
        (entry("a::b", match="(unclosed"), "match: expected a regular expression"),
        (entry("a::b", reach="somehow"), "reach: expected one of"),
        (entry("a::b") * 2, "listed twice"),
        ("[other]\nx = 1\n", r"expected only \[\[deviation\]\] tables"),
        ("[[deviation]\n", "not valid TOML"),
    ],
)
def test_malformed_files_name_the_problem(tmp_path, text, message):
    with pytest.raises(DeviationFileError, match=message):
        load_deviations(write(tmp_path, text))


def test_a_deviation_that_now_passes_fails_the_run(tmp_path):
    """Strict: a fix upstream shows up as an unexpected pass, and the run fails."""
    path = write(tmp_path, entry(CHECK, reason="was broken"))
    run = run_suites(tmp_path, f"--deviations={path}", "-k", "test_the_upstream_reproducer")
    assert run.returncode == 1
    result = run.outcome(CHECK)
    assert result["outcome"] == "xpass"
    assert "was broken" in result["reason"]


PIXELS_RANK = (
    "suites/conformance/test_contracts.py::test_invalid_inputs_are_rejected_naming_the_field"
    "[pixels-rank]"
)


@pytest.mark.parametrize(
    ("raises", "match", "outcome"),
    [
        ("AssertionError", "the call succeeded$", "xfail"),
        ("ValueError", "the call succeeded$", "fail"),
        ("AssertionError", "^pixel_values_flat: expected", "fail"),
    ],
    ids=["the-pinned-cause", "another-type", "another-message"],
)
def test_a_deviation_fails_as_known_only_for_its_pinned_cause(tmp_path, raises, match, outcome):
    """A reference mutant that skips the pixel contract fails this check with "the call
    succeeded": it is an expected failure only while the pinned type and pattern match, else a
    failure naming both causes; the actual cause of an expected failure is recorded."""
    path = write(tmp_path, entry(PIXELS_RANK, raises=raises, match=match))
    run = run_suites(
        tmp_path,
        "--target=reference-mutant:contract-accepts-wrong-shape",
        f"--deviations={path}",
        "-k",
        "pixels-rank",
        suite="suites/conformance/test_contracts.py",
    )
    result = run.outcome(PIXELS_RANK)
    assert result["outcome"] == outcome, result
    if outcome == "xfail":
        assert run.returncode == 0, run.output[-2000:]
        assert result["actual_cause"].startswith("AssertionError: expected a clear error")
        assert result["reach"] == "request"
    else:
        assert run.returncode == 1
        assert "known deviation failed for another reason" in result["reason"]
        assert f"expected {raises} matching {match!r}" in result["reason"]
        assert "got AssertionError: expected a clear error" in result["reason"]
        # Where the check failed, in Python's own traceback: what a deviation's reason cannot say.
        failure = run.output.split("known deviation failed for another reason")[1]
        traceback = failure.split("the check's traceback")[1]
        assert "Traceback (most recent call last):" in traceback, run.output[-3000:]
        assert 'test_contracts.py", line ' in traceback, run.output[-3000:]


def _wrapped() -> ValueError:
    """A ValueError raised from a TypeError, as vLLM's processing context re-raises."""
    try:
        try:
            raise TypeError("cannot unpack non-iterable int object")
        except TypeError as inner:
            raise ValueError("Failed to apply the processor") from inner
    except ValueError as outer:
        return outer


@pytest.mark.parametrize(
    ("raises", "match", "pinned"),
    [
        ("ValueError", r"^Failed to apply the processor$", True),
        ("ValueError", r"<- TypeError: cannot unpack non-iterable int object$", True),
        ("ValueError", r"<- KeyError", False),
        ("TypeError", r"cannot unpack", False),  # the type pinned is the raised one's
    ],
)
def test_a_wrapped_cause_can_be_pinned(raises, match, pinned):
    deviation = Deviation("a::b", "why", raises, match, "request")
    exc = _wrapped()
    assert (deviation.cause_of(exc) is None) is pinned
    assert describe(exc) == (
        "ValueError: Failed to apply the processor (caused by TypeError: cannot unpack "
        "non-iterable int object)"
    )


def test_every_committed_entry_states_how_a_user_reaches_it():
    for name in ("reference", "vllm"):
        for deviation in load_deviations(DEVIATIONS_DIR / f"{name}.toml").values():
            assert deviation.reach in REACHES, deviation.check


def test_stale_entries_are_reported(tmp_path):
    stale = "suites/conformance/test_passthrough.py::test_renamed_away"
    path = write(tmp_path, entry(stale))
    run = run_suites(tmp_path, f"--deviations={path}", "-k", "test_the_upstream_reproducer")
    assert run.returncode == 0
    assert run.results is not None
    assert run.results["stale_deviations"] == [stale]


def test_bad_deviations_file_exits_2(tmp_path):
    path = write(tmp_path, "[[deviation]]\n")
    run = run_suites(tmp_path, f"--deviations={path}", "--co")
    assert run.returncode == 2
    assert "deviation #1" in run.output


@functools.cache
def conformance_check_ids() -> frozenset[str]:
    """The ids of every conformance check, as ``pytest --co`` lists them (collected once)."""
    listed = run_forked(
        ["suites/conformance", "--co", "-q", "-p", "no:cacheprovider"], kind="torch"
    )
    assert listed.returncode == 0, listed.stdout[-3000:]
    return frozenset(listed.stdout.splitlines())


@pytest.mark.parametrize("name", ["reference", "vllm"])
def test_committed_deviations_match_existing_checks(name):
    """Every committed entry names a check the suites define (none renamed away)."""
    deviations = load_deviations(DEVIATIONS_DIR / f"{name}.toml")
    collected = conformance_check_ids()
    assert set(deviations) <= set(collected), sorted(set(deviations) - set(collected))
    for deviation in deviations.values():
        assert len(deviation.reason) > 20, f"{deviation.check}: give the reason, not a label"


def test_an_entry_for_some_releases_applies_to_them_alone(tmp_path):
    """A deviation whose cause changed between releases: one entry below the release, one
    from it on; the target applies the one its installed vLLM falls in."""
    entry = (
        '[[deviation]]\ncheck = "suites/conformance/test_x.py::test_y"\nreason = "{why}"\n'
        'raises = "{raises}"\nmatch = "m"\nreach = "request"\nreleases = "{releases}"\n'
    )
    path = tmp_path / "split.toml"
    path.write_text(
        entry.format(why="crash", raises="RuntimeError", releases="<0.34.0")
        + entry.format(why="rows", raises="AssertionError", releases=">=0.34.0")
    )
    check = "suites/conformance/test_x.py::test_y"
    assert load_deviations(path, "0.33.0")[check].raises == "RuntimeError"
    assert load_deviations(path, "0.34.0")[check].raises == "AssertionError"
    assert load_deviations(path, "0.35.1")[check].raises == "AssertionError"
    assert load_deviations(path, None) == {}


@pytest.mark.parametrize(
    ("ranges", "error"),
    [
        (("<0.34.0", ">=0.35.0"), "is listed twice"),
        (("<0.34.0", None), "is listed twice"),
        (("~=0.34",), "releases: expected '<X' or '>=X'"),
    ],
)
def test_entries_for_one_check_must_split_at_one_release(tmp_path, ranges, error):
    text = ""
    for releases in ranges:
        text += (
            '[[deviation]]\ncheck = "suites/conformance/test_x.py::test_y"\nreason = "r"\n'
            'raises = "ValueError"\nmatch = "m"\nreach = "request"\n'
        )
        if releases is not None:
            text += f'releases = "{releases}"\n'
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(DeviationFileError, match=error):
        load_deviations(path, "0.34.0")
