"""A bounded load run on vLLM's OpenAI-compatible server: mixed chat requests at a fixed
concurrency, ending by itself.

    nemotron-vl-load [--requests 240] [--concurrency 16] [--time-limit 600] [--out DIR]

Runs in the CPU build's environment (``nox -s bench`` runs it there). Starts the server of the
default checkpoint variant (``harness.targets.server``), warms it up with one request of each
form, reads the memory of its process group (the API server, the engine core, the worker:
resident set sizes summed), then sends ``--requests`` chat requests cycling through the forms
(text, images, a video file, audio, all mixed), each with media of its own (no cache answers one
from another's), with at most ``--concurrency`` in flight, from asyncio through the official
``openai`` client. It stops sending at ``--time-limit`` seconds
(what was not sent is counted as such). Written: ``load.json`` and ``load.md`` (throughput,
latency percentiles per form and overall, errors by status, the memory after warm-up, at the end
and its growth). Exit status 0 when every request was answered and the memory grew by at most
``--memory-growth-limit`` MiB, 1 otherwise, 2 when the server did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import ROOT
from harness.inputs.requests import AUDIO_SAMPLE_RATE, Request
from harness.targets.engine.options import Sampling

#: The forms the run cycles through (the audio of a video's track aside: the chat parser's
#: known deviation adds a stray placeholder to its prompt).
LOAD_FORMS = ("text", "images-pil", "video-file", "audios", "mixed")
#: What each request asks: a short greedy answer, no log-probabilities (a user's usual request).
LOAD_SAMPLING = Sampling(max_tokens=16, logprobs=0, prompt_logprobs=None)
#: The memory a run's server may gain between warm-up and its end, MiB (caches are sized at
#: start: the KV cache explicitly, the processor cache by vLLM's default of 4 GiB at most, whose
#: entries for the five forms' items take a few MiB; more growth is a leak).
DEFAULT_MEMORY_GROWTH_LIMIT_MIB = 256


@dataclass
class Outcome:
    """One request: its form, when it was sent (seconds since the run began), how long it
    took, and its HTTP status (0: no answer) and error message where it failed."""

    form: str
    sent_s: float
    latency_s: float
    status: int
    error: str = ""


@dataclass
class LoadReport:
    requests: int
    concurrency: int
    time_limit_s: float
    memory_growth_limit_mib: float
    server: str = ""
    start_s: float = 0.0
    duration_s: float = 0.0
    not_sent: int = 0
    memory_after_warmup_mib: float = 0.0
    memory_at_end_mib: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def answered(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def errors(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            if o.status != 200:
                key = f"HTTP {o.status}" if o.status else "no answer"
                counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def memory_growth_mib(self) -> float:
        return self.memory_at_end_mib - self.memory_after_warmup_mib

    def problems(self) -> list[str]:
        found = [f"{n} requests got {what}" for what, n in sorted(self.errors.items())]
        if self.not_sent:
            found.append(f"{self.not_sent} requests not sent within {self.time_limit_s:g} s")
        if self.memory_growth_mib > self.memory_growth_limit_mib:
            found.append(
                f"the server's memory grew by {self.memory_growth_mib:.0f} MiB, above "
                f"{self.memory_growth_limit_mib:g}"
            )
        return found

    def summary(self) -> dict[str, Any]:
        latencies = sorted(o.latency_s for o in self.answered)
        by_form = {
            form: percentiles(sorted(o.latency_s for o in self.answered if o.form == form))
            for form in LOAD_FORMS
        }
        return {
            "requests": self.requests,
            "answered": len(self.answered),
            "not_sent": self.not_sent,
            "errors": self.errors,
            "concurrency": self.concurrency,
            "duration_s": round(self.duration_s, 2),
            "throughput_rps": round(len(self.answered) / self.duration_s, 3)
            if self.duration_s
            else 0.0,
            "latency_s": percentiles(latencies),
            "latency_s_by_form": by_form,
            "server_start_s": round(self.start_s, 1),
            "memory_after_warmup_mib": round(self.memory_after_warmup_mib, 1),
            "memory_at_end_mib": round(self.memory_at_end_mib, 1),
            "memory_growth_mib": round(self.memory_growth_mib, 1),
            "memory_growth_limit_mib": self.memory_growth_limit_mib,
            "problems": self.problems(),
        }


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """The 50th, 90th and 99th percentiles (nearest rank) and the largest of sorted ``values``
    (empty: none)."""
    if not values:
        return {}

    def rank(q: int) -> float:
        index = min(len(values) - 1, max(0, -(-len(values) * q // 100) - 1))
        return round(values[index], 3)

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99), "max": round(values[-1], 3)}


def group_memory_mib(group: int) -> float:
    """The resident memory of process group ``group``'s processes, summed, in MiB."""
    import psutil

    total = 0
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == group:
                total += process.memory_info().rss
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return total / 2**20


def load_request(form: str, k: int) -> Request:
    """The ``k``-th request of the run, of ``form``: the form's request with media of its own
    (seeded by ``k``, the same sizes), so that no request is answered from the processor's or
    the encoder's cache of another: every request runs the towers."""
    from harness.inputs.media import audio_clip, pil_image, video_file_without_audio
    from harness.targets.server.forms import api_request

    request = api_request(form)
    seed = 1000 + k
    images = [pil_image(im.height, im.width, seed + 7 * i) for i, im in enumerate(request.images)]
    audios = [
        audio_clip(len(a) / AUDIO_SAMPLE_RATE, seed + 11 * i) for i, a in enumerate(request.audios)
    ]
    videos = [video_file_without_audio(seed) for _ in request.videos]
    return dataclasses.replace(
        request, prompt=f"{request.prompt} ({k})", images=images, audios=audios, videos=videos
    )


async def _run(server: Any, report: LoadReport) -> None:
    requests = [load_request(LOAD_FORMS[k % len(LOAD_FORMS)], k) for k in range(report.requests)]
    client = server.async_client()
    semaphore = asyncio.Semaphore(report.concurrency)
    began = time.monotonic()

    async def one(k: int) -> None:
        form = LOAD_FORMS[k % len(LOAD_FORMS)]
        async with semaphore:
            sent = time.monotonic() - began
            if sent > report.time_limit_s:
                report.not_sent += 1
                return
            start = time.monotonic()
            try:
                await server.chat_async(client, requests[k], LOAD_SAMPLING)
                outcome = Outcome(form, sent, time.monotonic() - start, 200)
            except Exception as e:
                status = getattr(e.__cause__, "status_code", None) or getattr(e, "status_code", 0)
                outcome = Outcome(form, sent, time.monotonic() - start, int(status or 0), str(e))
            report.outcomes.append(outcome)

    try:
        await asyncio.gather(*(one(k) for k in range(report.requests)))
    finally:
        await client.close()
    report.duration_s = time.monotonic() - began


def run(report: LoadReport) -> LoadReport:
    """Start the server, warm it up, load it, read its memory, stop it."""
    import tempfile

    from harness.checkpoints.cache import checkpoint_folder
    from harness.targets.engine.target import ENGINE_SPEC, require_cpu_build
    from harness.targets.server import ServerOptions
    from harness.targets.server.forms import api_request
    from harness.targets.server.process import Server

    require_cpu_build()
    options = ServerOptions(allowed_local_media_path=Path(tempfile.mkdtemp()))
    server = Server.start(checkpoint_folder(ENGINE_SPEC), options)
    report.server, report.start_s = server.command, server.start_seconds
    try:
        for form in LOAD_FORMS:  # warm-up: one of each
            server.chat(api_request(form), LOAD_SAMPLING)
        report.memory_after_warmup_mib = group_memory_mib(server.process.pid)
        asyncio.run(_run(server, report))
        report.memory_at_end_mib = group_memory_mib(server.process.pid)
    finally:
        server.stop()
    return report


def render(summary: dict[str, Any], server: str) -> str:
    lines = [
        "# Load run on vLLM's OpenAI-compatible server (CPU build)",
        "",
        f"`{server}`",
        "",
        f"- requests: {summary['requests']} mixed chat requests ({', '.join(LOAD_FORMS)}), "
        f"at most {summary['concurrency']} in flight; answered {summary['answered']}, not sent "
        f"{summary['not_sent']}, errors {summary['errors'] or 'none'}",
        f"- duration {summary['duration_s']} s: {summary['throughput_rps']} requests per second",
        f"- latency, all forms: {summary['latency_s']}",
        *(f"- latency, {form}: {p}" for form, p in summary["latency_s_by_form"].items()),
        f"- the server's memory (its process group's resident sets): "
        f"{summary['memory_after_warmup_mib']} MiB after warm-up, "
        f"{summary['memory_at_end_mib']} MiB at the end: grew "
        f"{summary['memory_growth_mib']} MiB (limit {summary['memory_growth_limit_mib']} MiB)",
        f"- server start: {summary['server_start_s']} s",
        "",
        "Problems: " + ("; ".join(summary["problems"]) or "none"),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nemotron-vl-load", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds")
    parser.add_argument(
        "--memory-growth-limit", type=float, default=DEFAULT_MEMORY_GROWTH_LIMIT_MIB, help="MiB"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "benchmarks")
    args = parser.parse_args(argv)
    for name in ("requests", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: expected a positive count, got {getattr(args, name)}")
    if args.time_limit <= 0:
        parser.error(f"--time-limit: expected positive seconds, got {args.time_limit}")
    report = LoadReport(args.requests, args.concurrency, args.time_limit, args.memory_growth_limit)
    from harness.targets.server.process import ServerError

    try:
        run(report)
    except ServerError as e:
        print(f"nemotron-vl-load: {e}", file=sys.stderr)
        return 2
    summary = report.summary()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load.json").write_text(
        json.dumps(
            {**summary, "server": report.server, "outcomes": [asdict(o) for o in report.outcomes]},
            indent=2,
        )
        + "\n"
    )
    text = render(summary, report.server)
    (args.out / "load.md").write_text(text)
    print(text)
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
