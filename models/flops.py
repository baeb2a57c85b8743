"""Model FLOPs utilisation: (6N + 12 L H Q T) FLOPs per token (PaLM appendix B, torchtitan), over the peak."""

from __future__ import annotations

# Dense bf16 tensor-core peaks (FLOP/s), from the vendors' datasheets (no sparsity).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


def flops_per_token(n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> float:
    return 6.0 * n_params + 12.0 * n_layers * n_heads * head_dim * seq_len


def peak_flops(device_name: str) -> float | None:
    """Peak of the first table entry whose name appears in the device name (longest names first)."""
    name = device_name.upper()
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key.upper() in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(tokens_per_s: float, per_token_flops: float, n_devices: int, peak: float | None) -> float | None:
    if not peak:
        return None
    return tokens_per_s * per_token_flops / (peak * n_devices)
