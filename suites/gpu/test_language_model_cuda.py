"""The reference language model on CUDA (run: pytest -m gpu --device cuda).

Tolerances: fp32 on CUDA (TF32 off) against fp32 on CPU, 1e-4 on logits, as the CPU prefill /
decode check; bf16 on CUDA against fp32 on CPU, relative max error <= 5e-2 of the largest logit
and at least 95% agreement of the argmax token (bf16 keeps 8 bits of mantissa: ~4e-3 relative
per operation, compounded over the layers).
"""

from __future__ import annotations

import pytest
import torch

from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.presets import tiny_text_config

pytestmark = pytest.mark.gpu

CONFIG = tiny_text_config("M*-EM*", hidden_size=64, mamba_num_heads=8, chunk_size=16)


@pytest.fixture(scope="module")
def cpu_model():
    torch.manual_seed(0)
    return NemotronHForCausalLM(CONFIG).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, CONFIG.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))


def on_cuda(model, dtype):
    torch.manual_seed(0)
    copy = NemotronHForCausalLM(CONFIG).eval()
    copy.load_state_dict(model.state_dict())
    return copy.to("cuda", dtype)


def test_fp32_cuda_matches_cpu(cpu_model, ids, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.no_grad():
        expected = cpu_model(ids)
        actual = on_cuda(cpu_model, torch.float32)(ids.to(device)).cpu()
    assert (actual - expected).abs().max() <= 1e-4


def test_bf16_cuda_is_close_to_fp32_cpu(cpu_model, ids, device):
    with torch.no_grad():
        expected = cpu_model(ids)
        actual = on_cuda(cpu_model, torch.bfloat16)(ids.to(device)).float().cpu()
    relative = (actual - expected).abs().max() / expected.abs().max()
    agreement = (actual.argmax(-1) == expected.argmax(-1)).float().mean()
    print(f"bf16 vs fp32: relative max error {relative:.4f}, argmax agreement {agreement:.3f}")
    assert relative <= 5e-2
    assert agreement >= 0.95


def test_cuda_decode_equals_prefill(cpu_model, ids, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = on_cuda(cpu_model, torch.float32)
    ids = ids.to(device)
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(2, ids.shape[1])
        steps = torch.cat([model(ids[:, t : t + 1], cache=cache) for t in range(ids.shape[1])], 1)
    assert (steps - full).abs().max() <= 1e-4
