"""Regression mutants: the installed vLLM model file with one upstream bug put back.

Each mutant is a named, minimal text edit of one installed file of the model (by default
``nano_nemotron_vl.py``; RADIO, Parakeet, the processor module and the configs too), written at
test time (no vLLM source is committed) and run as a ``vllm-file:`` target. The harness's own
tests run the suites on each and assert they fail for the right reason: proof that the suites
catch the regression class.

:data:`FAULTS` are mutants of another kind: not an upstream bug, but a fault no harness may be
stalled, passed or taken down by (a loop, an early exit, a segfault, unbounded allocation, an
exception at import, a syntax error); the harness's own tests run the main job on each.
:data:`FRONT_END` are bugs in the audio front end that the features check must see;
:data:`DELTA` small numeric shifts that only the derived parity bounds see.

Command line: ``nemotron-vl-file-mutant NAME DEST_DIR`` writes the mutant under
``DEST_DIR/<the file's path under site-packages>`` and prints the ``--target`` value.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.model_files import (
    MODEL_FILE,
    NEMOTRON_H_FILE,
    PARAKEET_FILE,
    PEFT_HELPER_FILE,
    PROCESSOR_FILE,
    VllmNotInstalled,
    write_mutated_copy,
)


class MutationError(RuntimeError):
    """The installed file no longer has the code a mutation rewrites."""


@dataclass(frozen=True)
class Mutation:
    name: str
    upstream: str  # the vLLM pull request that fixed the bug this puts back
    description: str
    pattern: str  # a regular expression matching exactly once in the installed file
    replacement: str
    file: Path = MODEL_FILE  # the installed file it edits, relative to site-packages

    def apply(self, source: str) -> str:
        mutated, count = re.subn(self.pattern, self.replacement, source, flags=re.MULTILINE)
        if count != 1:
            raise MutationError(
                f"mutant {self.name!r}: expected its pattern once in {self.file}, found it "
                f"{count} times; the installed vLLM changed: update the pattern"
            )
        return mutated


def _indented(code: str) -> str:
    """A replacement that puts ``code``'s lines at the matched ``indent``."""
    return "".join(f"\\g<indent>{line}\n" if line else "\n" for line in code.splitlines())


#: The pre-#16229 merge: the VL class's own ``embed_input_ids``, placing the rows where the prompt
#: holds the image context token id.
_MERGE_BY_TOKEN_ID = """\
def embed_input_ids(self, input_ids, multimodal_embeddings=None, *, is_multimodal=None):
    inputs_embeds = self.language_model.embed_input_ids(input_ids)
    if multimodal_embeddings is None or len(multimodal_embeddings) == 0:
        return inputs_embeds
    context = torch.tensor(self._img_context_token_ids, device=input_ids.device)
    return _merge_multimodal_embeddings(
        inputs_embeds, multimodal_embeddings, torch.isin(input_ids, context)
    )

"""


MUTATIONS: dict[str, Mutation] = {
    m.name: m
    for m in (
        Mutation(
            name="image-embeds-walrus-truthiness",
            upstream="#56398",
            description=(
                'the image_embeds check rewritten to `if image_embeds := kwargs.pop("image_embeds",'
                " None):`: a stacked tensor has no truth value"
            ),
            pattern=(
                r'^(?P<indent>[ \t]+)image_embeds = kwargs\.pop\("image_embeds", None\)\n'
                r"(?P=indent)if image_embeds is not None:"
            ),
            replacement=r'\g<indent>if image_embeds := kwargs.pop("image_embeds", None):',
        ),
        Mutation(
            name="lora-wrapper-on-video-markers",
            upstream="#56231",
            description="video marker tokens embedded through the LoRA wrapper, not its base layer",
            pattern=(
                r"^(?P<indent>[ \t]+)if isinstance\(embed_tokens, BaseLayerWithLoRA\):\n"
                r"(?P=indent)[ \t]+embed_tokens = embed_tokens\.base_layer\n"
            ),
            replacement="",
        ),
        Mutation(
            name="lora-metadata-drift",
            upstream="#56231",
            description="the VL class's embedding_modules no longer the language model's",
            pattern=(
                r"^(?P<indent>[ \t]+)embedding_modules = "
                r"NemotronHForCausalLM\.embedding_modules$"
            ),
            replacement=r'\g<indent>embedding_modules = {"embed_tokens": "input_embeddings"}',
        ),
        Mutation(
            name="lora-packed-qkv-misordered",
            upstream="#56231",
            description=(
                "the language model's packed_modules_mapping lists qkv_proj's parts as q, v, k: "
                "a LoRA adapter's k_proj and v_proj deltas land in each other's slices"
            ),
            pattern=(
                r'^(?P<indent>[ \t]+)"qkv_proj": \[\n(?P<item>[ \t]+)"q_proj",\n'
                r'(?P=item)"k_proj",\n(?P=item)"v_proj",\n'
            ),
            replacement=(
                r'\g<indent>"qkv_proj": [\n\g<item>"q_proj",\n\g<item>"v_proj",\n'
                r'\g<item>"k_proj",\n'
            ),
            file=NEMOTRON_H_FILE,
        ),
        Mutation(
            name="lora-tower-layers-wrapped",
            upstream="#56231",
            description=(
                "get_mm_mapping's language-model prefix empty: every module's name starts with "
                "it, so vLLM's LoRA manager wraps the towers' layers as the language model's "
                "and applies an adapter's tower modules"
            ),
            pattern=r'^(?P<indent>[ \t]+)language_model="language_model",$',
            replacement=r'\g<indent>language_model="",',
        ),
        Mutation(
            name="lora-scaling-dropped",
            upstream="#56231",
            description="an adapter's delta B A x added unscaled: alpha / r dropped (rsLoRA kept)",
            pattern=r"^(?P<indent>[ \t]+)return alpha / rank$",
            replacement=r"\g<indent>return 1.0",
            file=PEFT_HELPER_FILE,
        ),
        Mutation(
            name="deepcopy-live-config",
            upstream="#38655",
            description="the state-shape helper deep-copies the whole VllmConfig",
            pattern=(
                r"^(?P<indent>[ \t]+)temp_vllm_config = "
                r"vllm_config\.with_hf_config\(text_config\)\n"
                r"(?P<ret>(?P=indent)return "
                r"NemotronHForCausalLM\.get_mamba_state_shape_from_config)"
            ),
            replacement=(
                r"\g<indent>temp_vllm_config = __import__('copy').deepcopy(vllm_config)\n"
                r"\g<indent>temp_vllm_config.model_config.hf_config = text_config\n\g<ret>"
            ),
        ),
        Mutation(
            name="processor-in-metadata",
            upstream="#38655",
            description="supports_video builds the HF processor (shared tokenizer under load)",
            pattern=(
                r"^(?P<indent>[ \t]+)def supports_video\(self\):\n"
                r"(?P=indent)[ \t]+return True"
            ),
            replacement=(
                "\\g<indent>def supports_video(self):\n"
                "\\g<indent>    self.get_hf_processor()\n"
                "\\g<indent>    return True"
            ),
        ),
        Mutation(
            name="text-only-loads-tower-weights",
            upstream="#41205",
            description="with every modality limit 0, tower weights are still loaded",
            pattern=r"^(?P<indent>[ \t]+)load_multimodal_weights = not all\(",
            replacement=r"\g<indent>load_multimodal_weights = True or not all(",
        ),
        Mutation(
            name="tower-weights-kept-by-reference",
            upstream="#42244",
            description=(
                "RADIO's tensors buffered by reference, not copied: a streaming loader that "
                "reuses its buffers overwrites them before they are loaded"
            ),
            pattern=r"vision_weights\.append\(\(hf_key, w\.detach\(\)\.clone\(\)\)\)",
            replacement="vision_weights.append((hf_key, w))",
        ),
        Mutation(
            name="image-embeds-through-the-encoder",
            upstream="#56398",
            description=(
                "precomputed image embeddings fed to the vision encoder as if they were pixels, "
                "instead of passed through"
            ),
            pattern=r'^(?P<indent>[ \t]+)image_embeddings = image_input\["data"\]$',
            replacement=r'\g<indent>image_embeddings = self.extract_feature(image_input["data"])',
        ),
        Mutation(
            name="quant-config-names-not-mapped",
            upstream="#39901",
            description=(
                "the VL class's hf_to_vllm_mapper removed: a quantization config naming "
                "language_model.backbone.* modules is never renamed to vLLM's "
                "language_model.model.* (the weights still load: the language model maps its own "
                "names)"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)hf_to_vllm_mapper = WeightsMapper\(\n"
                r"(?P=indent)[ \t]+orig_to_new_prefix=\{\n"
                r'(?P=indent)[ \t]+"language_model\.backbone": "language_model\.model",\n'
                r"(?P=indent)[ \t]+\},\n"
                r"(?P=indent)\)\n"
            ),
            replacement="",
        ),
        Mutation(
            name="parakeet-conv-bias-rejected",
            upstream="#40007",
            description=(
                "Parakeet's loader no longer skips the convolution biases a checkpoint carries "
                "when its config says convolution_bias=False: 'Unknown weight' at load"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)if self\._can_skip_missing_named_param\(target_name\):\n"
                r"(?P=indent)[ \t]+continue\n"
            ),
            replacement="",
            file=Path("vllm/model_executor/models/parakeet.py"),
        ),
        Mutation(
            name="video-embeds-not-routed",
            upstream="#56398",
            description='"video_embeds" removed from the video routing keys: silently 0 outputs',
            pattern=r'\(\s*"pixel_values_flat_video",\s*"video_embeds"\s*\)',
            replacement='("pixel_values_flat_video",)',
        ),
        Mutation(
            name="mm-only-bypasses-processor-text",
            upstream="#38567",
            description=(
                "the _get_hf_mm_text override removed: multimodal-only processing calls the "
                "model's processor with no text, not the model's own placeholder text, so its "
                "image and audio expansion never runs"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)def _get_hf_mm_text\(self, mm_counts: Mapping\[str, int\]\) "
                r"-> str:\n"
                r"(?P=indent)[ \t]+return self\.dummy_inputs\.get_dummy_text\(mm_counts\)\n\n"
            ),
            replacement="",
        ),
        Mutation(
            name="image-budget-drops-thumbnail",
            upstream="#38727",
            description=(
                "get_mm_max_tokens_per_item budgets a static-tiling image at max_num_tiles "
                "tiles: the thumbnail tile the processor adds is not counted"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)\(target_width, target_height\),\n"
                r"[ \t]+processor\.get_num_image_tokens\(\n"
                r"[ \t]+image_width=target_width,\n"
                r"[ \t]+image_height=target_height,\n"
                r"[ \t]+max_num_tiles=max_num_tiles,\n"
                r"[ \t]+\),\n"
            ),
            replacement=(
                "\\g<indent>(target_width, target_height),\n"
                "\\g<indent>max_num_tiles * processor.num_image_token,\n"
            ),
        ),
        Mutation(
            name="pil-pixel-limit-off",
            upstream="#47010",
            description=(
                "the processor module switches PIL's decompression-bomb limit off at import "
                "(Image.MAX_IMAGE_PIXELS = None): any image is decoded, however large"
            ),
            pattern=r"^from PIL import Image\n",
            replacement="from PIL import Image\n\nImage.MAX_IMAGE_PIXELS = None\n",
            file=PROCESSOR_FILE,
        ),
        Mutation(
            name="audio-in-video-uncapped",
            upstream="#50221",
            description=(
                "audio extracted from a video (use_audio_in_video) decoded without "
                "VLLM_MAX_AUDIO_DECODE_DURATION_S: a small file can expand without bound"
            ),
            pattern=(
                r"load_audio_pyav\(\n(?P<indent>[ \t]+)BytesIO\(video_bytes\),\n"
                r"[ \t]+max_duration_s=envs\.VLLM_MAX_AUDIO_DECODE_DURATION_S,\n"
            ),
            replacement="load_audio_pyav(\n\\g<indent>BytesIO(video_bytes),\n",
        ),
        Mutation(
            name="audio-one-clip",
            upstream="#36671",
            description=(
                "audio no longer split into 30 s clips: the whole audio is one clip, however "
                "long (the encoder's memory grows with its square)"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)num_full_clips, remainder = "
                r"divmod\(audio_len, self\._clip_target_samples\)$"
            ),
            replacement=r"\g<indent>num_full_clips, remainder = 0, audio_len",
            file=PARAKEET_FILE,
        ),
        Mutation(
            name="feature-size-cache-per-image",
            upstream="#38655",
            description=(
                "dynamic-resolution token counts kept in a class-level cache keyed by the image "
                "(its size: vLLM hands the processor a fresh copy of every image, so upstream's "
                "id() key is never reused on purpose), whatever the context budget"
            ),
            pattern=(r"^(?P<indent>[ \t]+)feature_size = num_tokens_per_image\[item_idx\]$"),
            replacement=(
                "\\g<indent>key = tuple(mm_items.get_items('image', ImageProcessorItems)"
                ".get_image_size(item_idx))\n"
                "\\g<indent>cache = type(self).__dict__.get('feature_size_cache')\n"
                "\\g<indent>if cache is None:\n"
                "\\g<indent>    cache = {}\n"
                "\\g<indent>    type(self).feature_size_cache = cache\n"
                "\\g<indent>feature_size = cache.setdefault(key, num_tokens_per_image[item_idx])"
            ),
        ),
        Mutation(
            name="merge-by-token-id-search",
            upstream="#16229",
            description=(
                "the VL class merges its embeddings into the prompt where the prompt holds the "
                "image context token id, not where the engine's placeholder mask says: a video's "
                "separator text and an audio clip's rows have no such token"
            ),
            pattern=r"^(?P<indent>[ \t]+)(?P<line>def embed_multimodal\(self, \*\*kwargs)",
            replacement=_indented(_MERGE_BY_TOKEN_ID) + r"\g<indent>\g<line>",
        ),
        Mutation(
            name="stacked-embeds-split-per-row",
            upstream="#26771",
            description=(
                "one static image's embedding returned as a bare [rows, h] tensor, not a "
                "one-item tuple: `tuple(...)` in embed_multimodal makes each row an item"
            ),
            pattern=(
                r"^(?P<head>[ \t]+# Only one image in the current batch\n"
                r"[ \t]+if len\(num_patches\) == 1:\n"
                r"[ \t]+return )\((?P<rows>image_embeds\.view\(-1, "
                r"self\.config\.text_config\.hidden_size\)),\)"
            ),
            replacement=r"\g<head>\g<rows>",
        ),
        Mutation(
            name="static-pixels-without-num-patches",
            upstream="#32682",
            description="the static-tile image input built without its num_patches",
            pattern=(
                r"^(?P<indent>[ \t]+)pixel_values_flat=pixel_values_flat,\n"
                r"(?P=indent)num_patches=image_num_patches,\n"
            ),
            replacement=r"\g<indent>pixel_values_flat=pixel_values_flat,\n",
        ),
        Mutation(
            name="static-pixels-flat-dropped",
            upstream="#40724",
            description=(
                "the static-tile image input built without pixel_values_flat (popped from the "
                "keyword arguments, then not passed)"
            ),
            pattern=(
                r"^(?P<indent>[ \t]+)pixel_values_flat=pixel_values_flat,\n"
                r"(?P<next>(?P=indent)num_patches=image_num_patches,\n)"
            ),
            replacement=r"\g<next>",
        ),
    )
}


#: Where the faults go: the top of the image parser (every image input passes it; video, audio
#: and text inputs do not), or the first import of the module.
_IMAGE_PARSER = r'^(?P<indent>[ \t]+)(?P<line>image_embeds = kwargs\.pop\("image_embeds", None\)\n)'
_FIRST_IMPORT = r"^(?P<line>import math\n)"


def _inserted(
    name: str,
    upstream: str,
    description: str,
    where: str,
    code: str,
    *,
    after: bool = False,
    file: Path = MODEL_FILE,
) -> Mutation:
    """``code`` (lines, indented to the insertion point) put before the line ``where`` matches
    (its group ``line``), or ``after`` it; a group ``next`` that follows is kept as it is."""
    indent = r"\g<indent>" if "(?P<indent>" in where else ""
    inserted = "".join(f"{indent}{line}\n" for line in code.splitlines())
    rest = r"\g<next>" if "(?P<next>" in where else ""
    line = indent + r"\g<line>"
    replacement = line + inserted + rest if after else inserted + line + rest
    return Mutation(name, upstream, description, where, replacement, file)


def _fault(name: str, description: str, where: str, code: str) -> Mutation:
    return _inserted(name, "fault injection", description, where, code)


FAULTS: dict[str, Mutation] = {
    m.name: m
    for m in (
        _fault(
            "image-parser-loops",
            "the image parser loops forever",
            _IMAGE_PARSER,
            "while True:\n    pass",
        ),
        _fault(
            "image-parser-deadlocks",
            "the image parser waits forever for a lock nobody releases, as a deadlock does",
            _IMAGE_PARSER,
            "held = __import__('threading').Lock()\nheld.acquire()\nheld.acquire()",
        ),
        _fault(
            "image-parser-exits-0",
            "the image parser ends the process with status 0",
            _IMAGE_PARSER,
            "__import__('os')._exit(0)",
        ),
        _fault(
            "image-parser-segfaults",
            "the image parser reads address 0 (SIGSEGV)",
            _IMAGE_PARSER,
            "__import__('ctypes').string_at(0)",
        ),
        _fault(
            "image-parser-allocates",
            "the image parser allocates without bound, as a decompression bomb does",
            _IMAGE_PARSER,
            "hoard = []\nwhile True:\n    hoard.append(b'A' * (64 << 20))",
        ),
        _fault(
            "import-raises",
            "the module raises at import",
            _FIRST_IMPORT,
            "raise RuntimeError('fault injected at import')",
        ),
        _fault(
            "syntax-error",
            "the module does not parse",
            _FIRST_IMPORT,
            "def broken(:",
        ),
    )
}


#: Mutants of another kind again: not an upstream bug, but a bug in the audio front end (vLLM's
#: ``ParakeetExtractor``) of the sort the features check (``suites/conformance/test_features.py``)
#: exists to see before a tower's rounding hides it. ``suites/harness/test_front_end_mutants.py``
#: proves each fails it, on the audio forms, and that the unmutated file passes.
FRONT_END: dict[str, Mutation] = {
    m.name: m
    for m in (
        Mutation(
            name="stft-window-periodic",
            upstream="none (front-end proof)",
            description="the STFT's Hann window periodic instead of symmetric",
            pattern=r"torch\.hann_window\(win_length, periodic=False, device=device\)",
            replacement="torch.hann_window(win_length, periodic=True, device=device)",
            file=PARAKEET_FILE,
        ),
        Mutation(
            name="mel-scale-htk",
            upstream="none (front-end proof)",
            description="the mel filter bank on the HTK mel scale instead of Slaney's",
            pattern=r'^(?P<indent>[ \t]+)mel_scale="slaney",$',
            replacement=r'\g<indent>mel_scale="htk",',
            file=PARAKEET_FILE,
        ),
        Mutation(
            name="normalisation-biased-variance",
            upstream="none (front-end proof)",
            description="each bin's variance over time divided by n instead of n - 1",
            pattern=r"^(?P<indent>[ \t]+)lengths - 1\n(?P<close>[ \t]+\)\.unsqueeze\(-1\))",
            replacement=r"\g<indent>lengths\n\g<close>",
            file=PARAKEET_FILE,
        ),
        Mutation(
            name="padding-mask-one-frame-long",
            upstream="none (front-end proof)",
            description=(
                "the feature mask one frame long (<= for <): a frame past the audio enters the "
                "statistics and the features"
            ),
            pattern=r"^(?P<indent>[ \t]+)< features_lengths\[:, None\]$",
            replacement=r"\g<indent><= features_lengths[:, None]",
            file=PARAKEET_FILE,
        ),
    )
}


#: Where a static tile's or a video frame's rows leave ``mlp1`` in ``extract_feature`` (the
#: line before they are collected), and where the sound encoder's rows leave its projection.
_VISION_ROWS = (
    r"^(?P<indent>[ \t]+)(?P<line>vit_embeds = self\.mlp1\(vit_embeds\)\n)"
    r"(?P<next>(?P=indent)vit_embeds_list\.append\(vit_embeds\)\n)"
)
#: Where ``get_vit_model_from_radio_config`` passes the patch size to ``RadioConfig``.
_RADIO_CONFIG = (
    r"^(?P<indent>[ \t]+)(?P<line>patch_size=patch_size,\n)"
    r"(?P<next>(?P=indent)norm_mean=hf_config\.norm_mean,\n)"
)
_SOUND_ROWS = r"^(?P<indent>[ \t]+)(?P<line>outputs = self\.projection\(outputs\)\n)"


def _shift(name: str, description: str, where: str, code: str, file: Path) -> Mutation:
    return _inserted(
        name, "none (numeric bound proof)", description, where, code, after=True, file=file
    )


#: Mutants of yet another kind: an honest-looking numeric regression that moves a path's rows
#: by less than the old single bound (16 bf16 unit roundoffs, 6.25 %) and more than the path's
#: derived bound (``harness.oracles.bounds``): a layer's output scaled by 1 + delta, an epsilon
#: changed, one hidden channel or one position off. ``suites/harness/test_delta_mutants.py``
#: proves each fails the parity checks by the statistic it names, and that the unmutated file
#: passes.
DELTA: dict[str, Mutation] = {
    m.name: m
    for m in (
        _shift(
            "vision-rows-scaled-3pc",
            "static tiles' and video frames' rows scaled by 1.03 after mlp1",
            _VISION_ROWS,
            "vit_embeds = vit_embeds * 1.03",
            MODEL_FILE,
        ),
        _shift(
            "vision-rows-scaled-4.5pc",
            "static tiles' and video frames' rows scaled by 1.045 after mlp1",
            _VISION_ROWS,
            "vit_embeds = vit_embeds * 1.045",
            MODEL_FILE,
        ),
        _shift(
            "sound-rows-scaled-5pc",
            "the sound encoder's rows scaled by 1.05 after its projection",
            _SOUND_ROWS,
            "outputs = outputs * 1.05",
            PARAKEET_FILE,
        ),
        _shift(
            "radio-norm-eps-3e-5",
            "RADIO's layer norms built with epsilon 3e-5 instead of the config's 1e-6",
            _RADIO_CONFIG,
            "layer_norm_eps=3e-5,",
            MODEL_FILE,
        ),
        _shift(
            "vision-channel-scaled",
            "hidden channel 0 of static tiles' and video frames' rows scaled by 1.2",
            _VISION_ROWS,
            "vit_embeds[..., :1] *= 1.2",
            MODEL_FILE,
        ),
        _shift(
            "vision-first-row-scaled",
            "the first row of the first tile (or frame) of each call scaled by 1.05",
            _VISION_ROWS,
            "vit_embeds[:1, :1] *= 1.05",
            MODEL_FILE,
        ),
    )
}


def write_mutant(name: str, dest_dir: Path) -> Path:
    """Write mutant ``name`` under ``dest_dir`` at its file's path; return the file."""
    known = MUTATIONS | FAULTS | FRONT_END | DELTA
    if name not in known:
        raise MutationError(f"mutant: expected one of {sorted(known)}, got {name!r}")
    mutation = known[name]
    try:
        return write_mutated_copy(mutation.file, dest_dir, mutation.apply)
    except VllmNotInstalled as e:
        raise MutationError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(MUTATIONS | FAULTS | FRONT_END | DELTA))
    parser.add_argument("dest_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        path = write_mutant(args.name, args.dest_dir)
    except MutationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"--target vllm-file:{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
