"""A harness request as a user sends it to the OpenAI API, and the API's answer as an
:class:`~harness.targets.engine.EngineOutput`.

A request's prompt keeps its placeholders (``<image>``, ``<video>``, ``<so_embedding>``) where it
has them: vLLM's chat parser adds none for media whose placeholders the text already holds. The
media travel in the API's documented forms: images as PNG (lossless: the server decodes the
pixels the request holds), video files as they are (a clip of frames alone has no file to send),
audio as 32-bit float WAV (``input_audio``, lossless), given embeddings as ``image_embeds`` /
``video_embeds`` parts holding ``torch.save`` output in base64. With ``media_folder``, images and
audio are files there, named by ``file://`` URLs (``--allowed-local-media-path``).
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.inputs.requests import AUDIO_SAMPLE_RATE, AudioClip, Request, VideoFile
from harness.targets.engine.options import EngineOutput, Sampling
from harness.targets.server.options import SERVED_MODEL
from harness.targets.vllm.requests import processor_kwargs


class ServerRequestError(ValueError):
    """A request the API cannot carry as given."""


def png_bytes(image: Any) -> bytes:
    """A PIL image or an ``[H, W, 3]`` uint8 array as PNG bytes."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ServerRequestError(
                f"image: expected an [H, W, 3] uint8 array, got {image.dtype} {image.shape}"
            )
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise ServerRequestError(f"image: expected a PIL image or array, got {type(image)}")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """Mono samples as a WAV file of 32-bit IEEE floats (format 3): decoded, the same
    samples."""
    data = np.ascontiguousarray(samples, dtype="<f4")
    if data.ndim != 1:
        raise ServerRequestError(f"audio: expected mono samples [n], got shape {data.shape}")
    payload = data.tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    fact = struct.pack("<I", data.size)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += b"fact" + struct.pack("<I", len(fact)) + fact
    chunks += b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def tensor_base64(tensor: torch.Tensor) -> str:
    """An embeddings tensor in the API's encoding: ``torch.save`` output, base64."""
    buffer = io.BytesIO()
    torch.save(tensor.contiguous(), buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _file_url(folder: Path, suffix: str, data: bytes) -> str:
    path = folder / f"{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    if not path.exists():
        path.write_bytes(data)
    return path.as_uri()


def _audio(item: Any) -> tuple[np.ndarray, int]:
    if isinstance(item, AudioClip):
        return item.samples, item.rate
    return np.asarray(item), AUDIO_SAMPLE_RATE


def content_parts(request: Request, media_folder: Path | None = None) -> list[dict[str, Any]]:
    """The request as one user message's content parts: its prompt, then its items."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": request.prompt}]
    image_embeds = request.embeddings("image")
    if image_embeds is not None:
        parts += [{"type": "image_embeds", "image_embeds": tensor_base64(e)} for e in image_embeds]
    else:
        for image in request.images:
            data = png_bytes(image)
            url = (
                _data_url("image/png", data)
                if media_folder is None
                else _file_url(media_folder, ".png", data)
            )
            parts.append({"type": "image_url", "image_url": {"url": url}})
    video_embeds = request.embeddings("video")
    if video_embeds is not None:
        parts += [{"type": "video_embeds", "video_embeds": tensor_base64(e)} for e in video_embeds]
    else:
        for index, video in enumerate(request.videos):
            if not isinstance(video, VideoFile):
                raise ServerRequestError(
                    f"videos[{index}]: the API takes video files; expected a VideoFile, got "
                    f"{type(video).__name__} (frames without a file)"
                )
            url = (
                _data_url("video/x-matroska", video.data)
                if media_folder is None
                else _file_url(media_folder, ".mkv", video.data)
            )
            parts.append({"type": "video_url", "video_url": {"url": url}})
    for item in request.audios:
        samples, rate = _audio(item)
        data = wav_bytes(samples, rate)
        if media_folder is None:
            encoded = base64.b64encode(data).decode()
            parts.append({"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}})
        else:
            url = _file_url(media_folder, ".wav", data)
            parts.append({"type": "audio_url", "audio_url": {"url": url}})
    return parts


def sent(body: Mapping[str, Any]) -> str:
    """What a chat body sends, in a line: each content part's type, a media part's URL scheme
    and media type (``data:image/png``, ``file``), and whether it streams."""
    described = []
    for message in body.get("messages") or []:
        for part in message.get("content") or []:
            kind = str(part.get("type"))
            payload = part.get(kind)
            url = payload.get("url") if isinstance(payload, Mapping) else None
            if isinstance(url, str):
                scheme = url.split(";", 1)[0] if url.startswith("data:") else url.split(":", 1)[0]
                kind += f" ({scheme})"
            elif kind == "input_audio" and isinstance(payload, Mapping):
                kind += f" ({payload.get('format')})"
            described.append(kind)
    return ", ".join(described) + ("; streamed" if body.get("stream") else "")


def chat_body(
    request: Request,
    sampling: Sampling,
    *,
    media_folder: Path | None = None,
    model: str = SERVED_MODEL,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of ``request``: greedy, with every decoded token's top
    log-probabilities (tokens named by id), the prompt's, and the prompt's ids and text back
    (vLLM's own fields)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": content_parts(request, media_folder)}],
        "temperature": 0.0,
        "max_tokens": sampling.max_tokens,
        "ignore_eos": sampling.ignore_eos,
        "logprobs": True,
        "top_logprobs": sampling.logprobs,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "return_prompt_text": True,
    }
    if sampling.prompt_logprobs is not None:
        body["prompt_logprobs"] = sampling.prompt_logprobs
    kwargs = processor_kwargs(request)
    if kwargs:
        body["mm_processor_kwargs"] = kwargs
    return body


def completion_body(
    prompt: str | Sequence[int], sampling: Sampling, *, model: str = SERVED_MODEL
) -> dict[str, Any]:
    """The ``/v1/completions`` body of a text prompt or of prompt token ids."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "temperature": 0.0,
        "max_tokens": sampling.max_tokens,
        "ignore_eos": sampling.ignore_eos,
        "logprobs": sampling.logprobs,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    if sampling.prompt_logprobs is not None:
        body["prompt_logprobs"] = sampling.prompt_logprobs
    return body


def _token_id(name: str, where: str) -> int:
    """A token named ``token_id:N`` (``return_tokens_as_token_ids``)."""
    prefix, _, number = name.partition(":")
    if prefix != "token_id" or not number.lstrip("-").isdigit():
        raise ServerRequestError(f"{where}: expected a token named 'token_id:N', got {name!r}")
    return int(number)


def _prompt_logprobs(ids: Sequence[int], entries: Sequence[Any] | None) -> list[float | None]:
    if entries is None:
        return [None] * len(ids)
    found: list[float | None] = []
    for position, entry in enumerate(entries):
        if entry is None:
            found.append(None)
            continue
        chosen = entry.get(str(ids[position]))
        if chosen is None:
            raise ServerRequestError(
                f"prompt_logprobs[{position}]: no entry for the prompt's token {ids[position]}"
            )
        found.append(float(chosen["logprob"]))
    return found


def chat_answer(response: Mapping[str, Any]) -> EngineOutput:
    """A ``/v1/chat/completions`` answer (not streamed) as the engine's output."""
    choice = response["choices"][0]
    ids = list(response.get("prompt_token_ids") or [])
    tokens = list(choice.get("token_ids") or [])
    chosen: list[float] = []
    runner_up: list[float | None] = []
    content = (choice.get("logprobs") or {}).get("content") or []
    for step, entry in enumerate(content):
        where = f"choices[0].logprobs.content[{step}]"
        token = _token_id(entry["token"], where)
        if step < len(tokens) and token != tokens[step]:
            raise ServerRequestError(f"{where}: token {token}, token_ids says {tokens[step]}")
        chosen.append(float(entry["logprob"]))
        others = [
            float(t["logprob"])
            for t in entry.get("top_logprobs") or []
            if _token_id(t["token"], where) != token
        ]
        runner_up.append(max(others) if others else None)
    return EngineOutput(
        ids,
        _prompt_logprobs(ids, response.get("prompt_logprobs")),
        tokens,
        chosen,
        runner_up,
        0,
        choice.get("finish_reason"),
    )


def completion_answer(response: Mapping[str, Any]) -> EngineOutput:
    """A ``/v1/completions`` answer (not streamed) as the engine's output."""
    choice = response["choices"][0]
    ids = list(choice.get("prompt_token_ids") or [])
    tokens = list(choice.get("token_ids") or [])
    logprobs = choice.get("logprobs") or {}
    chosen = [float(x) for x in logprobs.get("token_logprobs") or []]
    runner_up: list[float | None] = []
    for step, top in enumerate(logprobs.get("top_logprobs") or []):
        where = f"choices[0].logprobs.top_logprobs[{step}]"
        others = [float(v) for k, v in top.items() if _token_id(k, where) != tokens[step]]
        runner_up.append(max(others) if others else None)
    return EngineOutput(
        ids,
        _prompt_logprobs(ids, choice.get("prompt_logprobs")),
        tokens,
        chosen,
        runner_up,
        0,
        choice.get("finish_reason"),
    )


def streamed_chat_answer(chunks: Sequence[Mapping[str, Any]]) -> EngineOutput:
    """A streamed ``/v1/chat/completions`` answer, its chunks joined, as the engine's output:
    the prompt's ids come in the first chunk, each chunk's tokens and log-probabilities after."""
    ids: list[int] = []
    prompt_entries: Sequence[Any] | None = None
    tokens: list[int] = []
    content: list[Any] = []
    finish: str | None = None
    for chunk in chunks:
        ids = ids or list(chunk.get("prompt_token_ids") or [])
        prompt_entries = prompt_entries or chunk.get("prompt_logprobs")
        for choice in chunk.get("choices") or []:
            tokens += list(choice.get("token_ids") or [])
            content += list((choice.get("logprobs") or {}).get("content") or [])
            finish = choice.get("finish_reason") or finish
    joined = {
        "prompt_token_ids": ids,
        "prompt_logprobs": prompt_entries,
        "choices": [
            {"token_ids": tokens, "logprobs": {"content": content}, "finish_reason": finish}
        ],
    }
    return chat_answer(joined)


#: The body fields the ``openai`` client takes as arguments; the rest are vLLM's own and go in
#: its ``extra_body``.
_OPENAI_FIELDS = frozenset(
    {"model", "messages", "prompt", "temperature", "max_tokens", "logprobs", "top_logprobs"}
)


def client_arguments(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as the ``openai`` client's keyword arguments (vLLM's fields in ``extra_body``)."""
    arguments = {k: v for k, v in body.items() if k in _OPENAI_FIELDS}
    extra = {k: v for k, v in body.items() if k not in _OPENAI_FIELDS}
    if extra:
        arguments["extra_body"] = extra
    return arguments
