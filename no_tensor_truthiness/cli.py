"""``no-tensor-truthiness``: the command line.

    no-tensor-truthiness [PATH ...] [--format text|json|github|sarif] [--select CODES]
                         [--ignore CODES] [--exclude GLOB ...] [--include GLOB ...]
                         [--config PYPROJECT] [--no-cache] [--cache-dir DIR] [--jobs N]
                         [--fix] [--unsafe-fixes] [--diff]
                         [--type-aware] [--exit-zero] [--statistics] [--output FILE]
    no-tensor-truthiness rule CODE | --all      a rule's documentation
    no-tensor-truthiness --list-rules           one line per rule

Exit status: 0 no findings, 1 findings (or, with ``--diff``, changes to show), 2 a usage or
configuration error. A folder named ``rule`` is linted as ``./rule``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from no_tensor_truthiness.config import LintConfig, LintConfigError, find_pyproject, load_config
from no_tensor_truthiness.finding import Finding
from no_tensor_truthiness.fixes import fix_source
from no_tensor_truthiness.output import FORMATS, render
from no_tensor_truthiness.rules import RULES, rule_lines
from no_tensor_truthiness.runner import RunResult, discover, run


def _codes(text: str) -> frozenset[str]:
    codes = frozenset(c.strip().upper() for c in text.split(",") if c.strip())
    unknown = sorted(codes - set(RULES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown codes {unknown}; known: {sorted(RULES)}")
    return codes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="no-tensor-truthiness",
        description="Find places that take the truth value of a tensor (if t:, not t, t or u, "
        "assert t, bool(t), ...).",
    )
    p.add_argument(
        "paths", nargs="*", type=Path, default=[Path(".")], help="files or folders (default: .)"
    )
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("--select", type=_codes, help="only these codes, comma-separated")
    p.add_argument("--ignore", type=_codes, help="never these codes, comma-separated")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip matching files or folders (adds to the configuration)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="check files matching (replaces the configuration's include)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="PYPROJECT",
        help="read [tool.no-tensor-truthiness] from this file "
        "(default: the nearest pyproject.toml)",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--cache-dir", type=Path, default=Path(".no-tensor-truthiness-cache"))
    p.add_argument("--jobs", "-j", type=int, default=None, help="processes (default: cores)")
    p.add_argument(
        "--type-aware",
        action="store_true",
        help="also ask mypy for expression types (slow; needs mypy and torch)",
    )
    p.add_argument(
        "--fix",
        action="store_true",
        help="apply fixes (every fix of this lint is unsafe: it also needs --unsafe-fixes)",
    )
    p.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="let --fix and --diff use unsafe fixes (they change behaviour for some inputs)",
    )
    p.add_argument(
        "--diff", action="store_true", help="print the fixes as a unified diff; write nothing"
    )
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    p.add_argument("--statistics", action="store_true", help="print counts to stderr")
    p.add_argument("--output", type=Path, help="write the report here instead of stdout")
    p.add_argument("--list-rules", action="store_true", help="print the rule codes and exit")
    return p


def rule_command(argv: list[str]) -> int:
    """``no-tensor-truthiness rule CODE`` (or ``--all``): the rule's documentation."""
    if argv in (["--all"], ["-a"]):
        print("\n".join(rule.doc() for rule in RULES.values()), end="")
        return 0
    if len(argv) != 1 or argv[0].upper() not in RULES:
        shown = " ".join(argv) or "nothing"
        print(
            f"no-tensor-truthiness rule: expected one rule code or --all, got {shown}; "
            f"known codes: {', '.join(RULES)}",
            file=sys.stderr,
        )
        return 2
    print(RULES[argv[0].upper()].doc(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rule"]:
        return rule_command(argv[1:])
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 2
    if args.list_rules:
        print(rule_lines(), end="")
        return 0
    try:
        pyproject = args.config or find_pyproject(Path.cwd())
        if args.config is not None and not args.config.is_file():
            raise LintConfigError(f"--config: {args.config}: no such file")
        config = load_config(pyproject)
    except LintConfigError as e:
        print(f"no-tensor-truthiness: error: {e}", file=sys.stderr)
        return 2
    if args.select is not None:
        config = replace(config, select=args.select)
    if args.ignore is not None:
        config = replace(config, ignore=config.ignore | args.ignore)
    if args.exclude:
        config = replace(config, exclude=(*config.exclude, *args.exclude))
    if args.include:
        config = replace(config, include=tuple(args.include))
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(
            f"no-tensor-truthiness: error: no such file or folder: {', '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    files = discover(args.paths, config)
    result: RunResult = run(
        files, config, cache_dir=None if args.no_cache else args.cache_dir, jobs=args.jobs
    )
    if args.type_aware:
        from no_tensor_truthiness.typeaware import TypeAwareUnavailable, type_aware_findings

        try:
            extra = type_aware_findings(files, config)
        except TypeAwareUnavailable as e:
            print(f"no-tensor-truthiness: error: --type-aware: {e}", file=sys.stderr)
            return 2
        seen = {(f.path, f.line, f.col) for f in result.findings}
        result.findings = sorted(
            [*result.findings, *(f for f in extra if (f.path, f.line, f.col) not in seen)]
        )
    if args.fix or args.diff:
        status = fix_files(result, config, args)
        if args.diff:
            return 0 if args.exit_zero else status
    elif any(f.fix is not None for f in result.findings):
        count = sum(f.fix is not None for f in result.findings)
        print(
            f"no-tensor-truthiness: {count} of {len(result.findings)} findings have an unsafe "
            "fix (`--diff --unsafe-fixes` shows them, `--fix --unsafe-fixes` applies them)",
            file=sys.stderr,
        )
    text = render(result.findings, args.format)
    if args.output is not None:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    if args.statistics:
        s = result.stats
        print(
            f"{len(result.findings)} findings in {s.files} files ({s.parsed} parsed, "
            f"{s.skipped} skipped, {s.cached} cached, {s.lines} lines parsed; "
            f"{s.errors} unparseable, {s.internal_errors} internal errors)",
            file=sys.stderr,
        )
    return 0 if args.exit_zero or not result.findings else 1


def fix_files(result: RunResult, config: LintConfig, args: argparse.Namespace) -> int:
    """``--fix`` / ``--diff``: fix (or show the fixes of) every file with a fixable finding;
    ``result.findings`` becomes what is left. Returns 1 when ``--diff`` has something to show."""
    fixable = sorted({f.path for f in result.findings if f.fix is not None})
    if not args.unsafe_fixes:
        count = sum(f.fix is not None for f in result.findings)
        print(
            f"no-tensor-truthiness: no fixes applied: {count} unsafe "
            f"fix{'es' if count != 1 else ''} available (every fix of this lint changes behaviour "
            "for some input; `--unsafe-fixes` enables them)",
            file=sys.stderr,
        )
        return 0
    left: list[Finding] = [f for f in result.findings if f.path not in fixable]
    applied, diffs = 0, []
    for path in fixable:
        original = Path(path).read_text(encoding="utf-8")
        fixed = fix_source(
            original, path, tensor_key=config.tensor_key_pattern, enabled=config.enabled
        )
        if fixed.refused:
            print(f"no-tensor-truthiness: {path}: {fixed.refused}", file=sys.stderr)
        applied += fixed.applied
        left += fixed.remaining
        if args.diff:
            diffs.append(fixed.diff(original, path))
        elif fixed.source != original:
            Path(path).write_text(fixed.source, encoding="utf-8")
    result.findings = sorted(left)
    if args.diff:
        sys.stdout.write("".join(diffs))
        print(
            f"no-tensor-truthiness: {applied} fixes in {len(fixable)} files would be applied",
            file=sys.stderr,
        )
        return 1 if any(diffs) else 0
    print(
        f"no-tensor-truthiness: fixed {applied} findings in {len(fixable)} files "
        f"({len(result.findings)} left)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
