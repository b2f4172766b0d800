"""A vLLM release's environment (:mod:`harness.release_environments`): the requirements it is
installed from, the documented omissions, and the errors that name what is wrong. Expected
values are written by hand from wheel METADATA as the packaging specification lays it out."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from harness.release_environments import (
    OVERRIDES,
    Override,
    ReleaseError,
    check_version,
    distribution_name,
    environment_of,
    install,
    load_releases,
    newer_than_matrix,
    newest_listed,
    release_numbers,
    requirements_of,
    wheel_metadata,
)

METADATA = """Metadata-Version: 2.4
Name: vllm
Version: 0.34.0
Requires-Dist: regex
Requires-Dist: torch==2.14.0
Requires-Dist: flashinfer-python==0.7.3
Requires-Dist: protobuf>=5.29.6; platform_machine != "s390x"
Requires-Dist: pytest; extra == "test"
Requires-Dist: Flashinfer_Cubin==0.7.3; extra == "flashinfer"
"""


def test_a_release_is_installed_from_its_own_requirements_minus_the_override() -> None:
    assert requirements_of(METADATA) == [
        "regex",
        "torch==2.14.0",
        "flashinfer-python==0.7.3",
        'protobuf>=5.29.6; platform_machine != "s390x"',
    ]
    assert requirements_of(METADATA, ["flashinfer_python"]) == [
        "regex",
        "torch==2.14.0",
        'protobuf>=5.29.6; platform_machine != "s390x"',
    ]


def test_an_override_naming_what_the_release_does_not_require_is_stale() -> None:
    with pytest.raises(ReleaseError, match=r"leave_out: \['flashinfer-cubin'\] not among"):
        requirements_of(METADATA, ["flashinfer-cubin"])


def test_distribution_names_compare_as_the_index_compares_them() -> None:
    assert distribution_name("Flashinfer_Python==0.7.3; x") == "flashinfer-python"
    assert distribution_name("fastapi[standard]<0.137.0") == "fastapi"
    assert distribution_name("zope.interface>=5") == "zope-interface"


def test_a_wheel_s_metadata_is_read_from_its_dist_info(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.34.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.34.0.dist-info/METADATA", METADATA)
        archive.writestr("vllm/__init__.py", "")
    assert wheel_metadata(wheel) == METADATA
    empty = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(ReleaseError, match=r"expected one \.dist-info/METADATA, got"):
        wheel_metadata(empty)


@pytest.mark.parametrize("version", ["0.34", "0.34.0", "0.34.1rc1", "0.34.0.post1"])
def test_a_release_is_named_by_its_version(version: str) -> None:
    assert check_version(version) == version


@pytest.mark.parametrize("version", ["", "latest", "0.34.0; rm -rf /", "v0.34.0", "0.34.0 "])
def test_anything_else_is_refused_naming_it(version: str) -> None:
    with pytest.raises(ReleaseError, match=r"release: expected a vLLM version such as 0\.34\.0"):
        check_version(version)


def test_release_numbers_order_releases() -> None:
    assert release_numbers("0.33.0") < release_numbers("0.34.0") <= release_numbers("0.34.0rc1")
    assert release_numbers("0.34.0.post1") == (0, 34, 0)


def test_the_committed_releases_file_names_the_default_and_why_each_omission() -> None:
    releases = load_releases(OVERRIDES)
    check_version(releases.default)
    for release, override in releases.overrides.items():
        assert override.leave_out, release
        assert override.why, release
    # vLLM 0.34.0 pins flashinfer-python 0.7.3, which the index does not serve
    # (../shared/design/environment.md).
    assert releases.override("0.34.0").leave_out == ("flashinfer-python",)
    assert releases.override("9.9.9") == Override("9.9.9", (), "")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('default = "latest"\n', r"default: expected a vLLM version, got 'latest'"),
        ('default = "0.34.0"\nother = 1\n', r"expected the keys \['default', 'releases'\]"),
        (
            'default = "0.34.0"\n[releases."0.34.0"]\nleave_out = []\nwhy = "w"\n',
            r"releases\.'0\.34\.0'\.leave_out: expected a list of names",
        ),
        (
            'default = "0.34.0"\n[releases."0.34.0"]\nleave_out = ["x"]\nwhy = " "\n',
            r"releases\.'0\.34\.0'\.why: expected the reason",
        ),
        (
            'default = "0.34.0"\n[releases."0.34.0"]\nleave_out = ["x"]\n',
            r"expected the keys \['leave_out', 'why'\], got \['leave_out'\]",
        ),
        ("default = [", "cannot be read as TOML"),
    ],
)
def test_a_malformed_releases_file_is_named_by_field(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "releases.toml"
    path.write_text(text)
    with pytest.raises(ReleaseError, match=error):
        load_releases(path)


def test_the_default_release_lives_in_the_shared_environment_and_others_apart() -> None:
    releases = load_releases(OVERRIDES)
    shared = Path("/shared")
    assert environment_of(releases.default, releases, shared) == shared
    other = environment_of("0.1.0", releases, shared)
    assert other.name == "vllm-0.1.0"
    assert other.parent.name == "releases"


def test_the_install_downloads_the_wheel_then_installs_its_requirements_then_it(
    tmp_path: Path,
) -> None:
    """The commands the install runs, with pip stood in for by a recorder that writes the
    wheel pip would download."""
    commands: list[list[str]] = []

    def run(command: Sequence[str]) -> None:
        commands.append(list(command))
        if command[3] == "download":
            folder = Path(command[command.index("-d") + 1])
            with zipfile.ZipFile(folder / "vllm-0.34.0-py3-none-any.whl", "w") as archive:
                archive.writestr("vllm-0.34.0.dist-info/METADATA", METADATA)
        if command[3] == "install" and "-r" in command:
            listed = Path(command[command.index("-r") + 1]).read_text().split("\n")
            assert "flashinfer-python==0.7.3" not in listed
            assert "torch==2.14.0" in listed

    override = Override("0.34.0", ("flashinfer-python",), "not served")
    install(tmp_path / "python", "0.34.0", override, run)
    steps = [c[3] for c in commands]
    assert steps == ["download", "install", "install"]
    assert commands[0][4:7] == ["--quiet", "--no-deps", "vllm==0.34.0"]
    assert "--no-deps" in commands[2]
    assert commands[2][-1].endswith(".whl")


def test_the_newest_release_on_the_index_is_read_from_pip_s_answer() -> None:
    answer = "vllm (0.34.0)\nAvailable versions: 0.34.0, 0.33.0, 0.32.0\n"
    assert newest_listed(answer) == "0.34.0"
    with pytest.raises(ReleaseError, match=r"expected 'vllm \(X\.Y\.Z\)', got ''"):
        newest_listed("")
    with pytest.raises(ReleaseError, match="got 'ERROR: No matching distribution'"):
        newest_listed("ERROR: No matching distribution\n")


def test_a_release_is_new_when_past_every_release_the_matrix_knows() -> None:
    releases = load_releases(OVERRIDES)
    known = max([releases.default, *releases.overrides], key=release_numbers)
    assert not newer_than_matrix(known, releases)
    assert newer_than_matrix("99.0.0", releases)
    assert not newer_than_matrix("0.1.0", releases)
