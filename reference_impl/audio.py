"""Audio: clips, log-mel features, token counts, and the Parakeet tower with its projection.

Glossary: ``a`` audios, ``c`` 30-second clips (all audios), ``n`` samples, ``l`` feature frames,
``m`` mel bins, ``l'`` encoder frames (``l`` subsampled), ``D`` the encoder width, ``h`` the
language model's hidden size.

The encoder is ``transformers``' ``ParakeetEncoder`` (a real dependency: a Conformer is not
re-implemented here); the feature extractor, the clip split, the token count and the projection
are ours, written from the brief and checked against transformers' and vLLM's.

Pipeline (as vLLM's ``ParakeetExtractor``): mono; 30 s clips (a tail shorter than 0.1 s is
padded up to 0.1 s); pad to the longest clip; pre-emphasis within each clip's valid length;
STFT (``n_fft`` 512, hop 160, window 400, symmetric Hann, zero padding); power; Slaney mel
filterbank; ``log(x + 2**-24)``; per-clip, per-bin normalisation over the valid frames (mean,
unbiased std, eps 1e-5), padding frames set to 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from reference_impl.errors import ConfigError
from reference_impl.layers import ReLUSquared, RMSNorm

LOG_GUARD = 2.0**-24
NORM_EPS = 1e-5


@dataclass(frozen=True)
class AudioConfig:
    """The ``sound_config`` fields the audio path reads (Parakeet encoder + extractor)."""

    llm_hidden_size: int
    num_mel_bins: int = 128
    sampling_rate: int = 16000
    hop_length: int = 160
    win_length: int = 400
    n_fft: int = 512
    preemphasis: float = 0.97
    padding_value: float = 0.0
    clip_duration_s: float = 30.0
    clip_min_duration_s: float = 0.1
    subsampling_factor: int = 8
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    subsampling_conv_channels: int = 256
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096
    conv_kernel_size: int = 9
    convolution_bias: bool = True
    # The feed-forward's and the convolution module's activation (transformers' ACT2FN names).
    hidden_act: str = "silu"
    projection_hidden_size: int = 4096
    projection_bias: bool = False
    projection_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.subsampling_factor < 1 or self.subsampling_factor & (self.subsampling_factor - 1):
            raise ConfigError("subsampling_factor", "a power of two", self.subsampling_factor)
        from transformers.activations import ACT2FN  # transformers' encoder resolves the name

        if self.hidden_act not in ACT2FN:
            raise ConfigError("hidden_act", f"one of {sorted(ACT2FN)}", self.hidden_act)
        if self.subsampling_conv_stride < 1:
            raise ConfigError(
                "subsampling_conv_stride", "a positive int", self.subsampling_conv_stride
            )
        # transformers' encoder sizes its linear layer for mel bins // stride**layers; its
        # strided convolutions (the same arithmetic over the mel axis as over time) must leave
        # that many bins, or its first forward fails on the shapes.
        layers = self.subsampling_factor.bit_length() - 1  # log2: one strided conv per halving
        stride = self.subsampling_conv_stride
        bins = subsampled_length(self.num_mel_bins, self)
        sized_for = self.num_mel_bins // stride**layers
        if bins != sized_for or bins < 1:
            raise ConfigError(
                "subsampling_conv_stride",
                f"a stride whose {layers} convolutions leave num_mel_bins // stride**{layers} "
                f"mel bins (num_mel_bins={self.num_mel_bins}, kernel "
                f"{self.subsampling_conv_kernel_size}; {bins} left, {sized_for} expected)",
                stride,
            )

    def encoder_fields(self) -> dict[str, object]:
        """The Parakeet encoder's fields (``ParakeetEncoderConfig`` keyword arguments)."""
        names = (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "conv_kernel_size",
            "subsampling_factor",
            "subsampling_conv_channels",
            "subsampling_conv_kernel_size",
            "subsampling_conv_stride",
            "num_mel_bins",
            "convolution_bias",
            "hidden_act",
        )
        return {name: getattr(self, name) for name in names}

    @property
    def clip_samples(self) -> int:
        return round(self.clip_duration_s * self.sampling_rate)

    @property
    def min_clip_samples(self) -> int:
        return round(self.clip_min_duration_s * self.sampling_rate)


# ---------------------------------------------------------------------------------------------
# Counting: pure functions of the config (no processor, no tokenizer)


def clip_sizes(num_samples: int, config: AudioConfig) -> list[int]:
    """Samples per 30 s clip; a remainder is a last clip of at least ``clip_min_duration_s``."""
    num_samples = max(num_samples, config.min_clip_samples)
    full, rest = divmod(num_samples, config.clip_samples)
    return [config.clip_samples] * full + ([max(rest, config.min_clip_samples)] if rest else [])


def subsampled_length(frames: int, config: AudioConfig) -> int:
    """Encoder frames for ``frames`` feature frames: ``log2(factor)`` strided convolutions,
    each ``L = floor((L + 2*((k-1)//2) - k) / stride + 1)``."""
    k, stride = config.subsampling_conv_kernel_size, config.subsampling_conv_stride
    add_pad = (k - 1) // 2 * 2 - k
    length = float(frames)
    for _ in range(int(math.log2(config.subsampling_factor))):
        length = math.floor((length + add_pad) / stride + 1.0)
    return int(length)


def audio_token_count(num_samples: int, config: AudioConfig) -> int:
    """``<so_embedding>`` placeholders for an audio of ``num_samples`` samples (at least 1)."""
    total = sum(
        subsampled_length(size // config.hop_length, config)
        for size in clip_sizes(num_samples, config)
    )
    return max(1, total)


# ---------------------------------------------------------------------------------------------
# Features


def mel_filter_bank(num_freqs: int, num_mels: int, sampling_rate: int) -> torch.Tensor:
    """``[m, n_fft/2 + 1]`` triangular filters on the Slaney mel scale (linear below 1 kHz,
    logarithmic above), each normalised to unit area (Slaney norm)."""

    def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
        linear = 3.0 * hz / 200.0
        log = 15.0 + torch.log(hz.clamp(min=1e-10) / 1000.0) / (math.log(6.4) / 27.0)
        return torch.where(hz >= 1000.0, log, linear)

    def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
        linear = 200.0 * mel / 3.0
        log = 1000.0 * torch.exp(math.log(6.4) / 27.0 * (mel - 15.0))
        return torch.where(mel >= 15.0, log, linear)

    freqs = torch.linspace(0, sampling_rate / 2, num_freqs, dtype=torch.float64)
    edges = torch.tensor([0.0, sampling_rate / 2], dtype=torch.float64)
    mel_edges = hz_to_mel(edges)
    points = mel_to_hz(
        torch.linspace(float(mel_edges[0]), float(mel_edges[1]), num_mels + 2, dtype=torch.float64)
    )
    lower, center, upper = points[:-2, None], points[1:-1, None], points[2:, None]
    rising = (freqs[None] - lower) / (center - lower)
    falling = (upper - freqs[None]) / (upper - center)
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    filters = filters * (2.0 / (upper - lower))  # Slaney: unit area per filter
    return filters.float()


def split_into_clips(waveform: torch.Tensor, config: AudioConfig) -> list[torch.Tensor]:
    """One mono waveform ``[n]`` into clips (zero-padded to :func:`clip_sizes`)."""
    sizes = clip_sizes(int(waveform.shape[0]), config)
    waveform = nn.functional.pad(waveform, (0, max(0, sum(sizes) - waveform.shape[0])))
    return list(torch.split(waveform[: sum(sizes)], sizes))


def to_mono(audio: torch.Tensor | Sequence[float], index: int) -> torch.Tensor:
    """``[n]`` or ``[n, channels]`` (channels averaged) to float32 ``[n]``; rejects empty and
    non-finite audio with an error naming the item."""
    wave = torch.as_tensor(audio, dtype=torch.float32)
    if wave.ndim == 2:
        wave = wave.mean(-1)
    if wave.ndim != 1:
        raise ConfigError(
            f"audios[{index}]", "a [samples] or [samples, channels] waveform", tuple(wave.shape)
        )
    if wave.numel() == 0:
        raise ConfigError(f"audios[{index}]", "at least one sample", "0 samples")
    if not torch.isfinite(wave).all():
        raise ConfigError(f"audios[{index}]", "finite samples", "NaN or infinite values")
    return wave


def extract_features(
    audios: Sequence[torch.Tensor | Sequence[float]], config: AudioConfig
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Waveforms to ``input_audio_features [c, l, m]``, ``feature_attention_mask [c, l]`` and
    ``audio_num_clips [a]``."""
    clips: list[torch.Tensor] = []
    num_clips: list[int] = []
    for i, audio in enumerate(audios):
        pieces = split_into_clips(to_mono(audio, i), config)
        clips += pieces
        num_clips.append(len(pieces))
    lengths = torch.tensor([len(c) for c in clips])
    batch = torch.full((len(clips), int(lengths.max())), config.padding_value)
    for i, clip in enumerate(clips):
        batch[i, : len(clip)] = clip
    valid = torch.arange(batch.shape[1])[None] < lengths[:, None]
    emphasised = torch.cat([batch[:, :1], batch[:, 1:] - config.preemphasis * batch[:, :-1]], 1)
    emphasised = emphasised.masked_fill(~valid, 0.0)
    window = torch.hann_window(config.win_length, periodic=False)
    spectrum = torch.stft(
        emphasised,
        config.n_fft,
        hop_length=config.hop_length,
        win_length=config.win_length,
        window=window,
        return_complex=True,
        pad_mode="constant",
    )
    power = spectrum.real.square() + spectrum.imag.square()  # [c, freqs, l]
    filters = mel_filter_bank(config.n_fft // 2 + 1, config.num_mel_bins, config.sampling_rate)
    mel = torch.log(filters @ power + LOG_GUARD).transpose(1, 2)  # [c, l, m]
    frames = torch.div(
        lengths + config.n_fft // 2 * 2 - config.n_fft, config.hop_length, rounding_mode="floor"
    )
    mask = torch.arange(mel.shape[1])[None] < frames[:, None]
    m = mask[..., None]
    count = mask.sum(1)[:, None, None]
    mean = (mel * m).sum(1, keepdim=True) / count
    variance = ((mel * m - mean) ** 2 * m).sum(1, keepdim=True) / (count - 1)
    features = (mel - mean) / (variance.sqrt() + NORM_EPS) * m
    return features, mask, num_clips


# ---------------------------------------------------------------------------------------------
# The tower


class ParakeetAudioTower(nn.Module):
    """transformers' ``ParakeetEncoder`` then the projection ``RMSNorm -> Linear -> ReLU^2 ->
    Linear`` to the language model's width. Implements the wrapper's ``SoundEncoder``."""

    def __init__(self, config: AudioConfig) -> None:
        super().__init__()
        from transformers import ParakeetEncoder, ParakeetEncoderConfig

        self.config = config
        # As vLLM builds it: no input scaling, no attention bias.
        self.encoder = ParakeetEncoder(
            ParakeetEncoderConfig(
                **config.encoder_fields(),
                scale_input=False,
                attention_bias=False,
                dropout=0.0,
                dropout_positions=0.0,
                layerdrop=0.0,
                activation_dropout=0.0,
                attention_dropout=0.0,
            )
        )
        self.projection = nn.Sequential(
            RMSNorm(config.hidden_size, eps=config.projection_eps),
            nn.Linear(
                config.hidden_size, config.projection_hidden_size, bias=config.projection_bias
            ),
            ReLUSquared(),
            nn.Linear(
                config.projection_hidden_size, config.llm_hidden_size, bias=config.projection_bias
            ),
        )

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[c, l, m]`` features, ``[c, l]`` mask to ``[c, l', h]``."""
        hidden = self.encoder(input_features=features, attention_mask=mask).last_hidden_state
        out: torch.Tensor = self.projection(hidden)
        return out

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        return torch.tensor(
            [subsampled_length(int(n), self.config) for n in input_lengths],
            device=input_lengths.device,
        )
