"""The training sections: the model, LoRA, the pretraining run, short fine-tunes, and vLLM's engine settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from codemill.stage_config import StageConfig, runtime_only


class ModelConfig(StageConfig):
    """A Llama-style causal LM built from scratch."""

    hidden_size: int = Field(128, gt=0, description="Model width (embeddings, residual stream); a multiple of "
                                                    "num_heads.")
    intermediate_size: int = Field(344, gt=0, description="Hidden width of each block's SwiGLU MLP.")
    num_layers: int = Field(4, gt=0, description="Decoder blocks.")
    num_heads: int = Field(4, gt=0, description="Attention (query) heads; head size = hidden_size / num_heads.")
    num_kv_heads: int = Field(4, gt=0, description="Key/value heads (grouped-query attention); divides num_heads, "
                                                   "equal = plain multi-head attention.")
    rope_theta: float = Field(10000.0, gt=0, description="Base frequency of the rotary position embeddings "
                                                         "(Llama: 10000).")
    attention_dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on attention weights while training "
                                     "(HF LlamaConfig.attention_dropout); 0 = none.")


class LoraConfig(StageConfig):
    r: int = Field(8, gt=0, description="Rank of each adapter's low-rank update.")
    alpha: int = Field(16, gt=0, description="Scaling; usually 2 x r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input (peft lora_dropout); "
                                                        "0 = none.")
    target_modules: list[str] = Field(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj"], description="Linear layers that get adapters.")


class TrainConfig(StageConfig):
    model: ModelConfig = Field(default_factory=ModelConfig)
    init_from: str | None = Field(None, description="Pretrained model (local save_pretrained folder or hub "
                                                   "name) to fine-tune; empty = train from scratch.")
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters (peft) instead of all weights.")
    parallelism: Literal["ddp", "fsdp"] = Field("ddp", description="DDP, or FSDP2 (fully_shard per block).")
    nproc_per_node: int = Field(2, ge=1, description="torchrun processes per node.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    max_steps: int = Field(200, gt=0, description="Optimizer steps.")
    micro_batch_size: int = Field(8, gt=0, description="Sequences per rank per micro-step.")
    grad_accum_steps: int = Field(1, gt=0, description="Micro-steps per optimizer step.")
    lr: float = Field(3e-3, gt=0, description="Peak learning rate (AdamW).")
    schedule: Literal["cosine", "wsd"] = Field("cosine", description="Cosine decay or warmup-stable-decay.")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="WSD: share of steps spent decaying.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr as a fraction of the peak (cosine).")
    warmup_steps: int = Field(20, ge=0, description="Optimizer steps of linear lr warmup to the peak.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay of the weight matrices (norms and "
                                                       "biases are not decayed).")
    beta1: float = Field(0.9, gt=0, lt=1, description="AdamW first-moment (momentum) decay rate.")
    beta2: float = Field(0.95, gt=0, lt=1, description="AdamW second-moment decay rate.")
    grad_clip: float = Field(1.0, gt=0, description="Clip the global gradient L2 norm to this before each "
                                                    "optimizer step.")
    seed: int = Field(1234, description="Seed of the initial weights (scratch model, LoRA adapters) and of the "
                                        "data order.")
    seeds: int = runtime_only(default=1, ge=1, le=64, description="Train this many seeds of the candidate (seed, "
                              "seed + 1, ...; data stages shared), evaluate each, and gate the mean of their "
                              "scores with their spread as the seed noise; the model of `seed` is the one "
                              "promoted. Costs N trainings and evaluations.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Autocast dtype (bf16 on GPU).")
    compile: bool = Field(False, description="torch.compile the model (GPU).")
    val_sequences: int = Field(64, ge=0, description="Held-out rows scored at every checkpoint (val loss picks "
                                                     "the best checkpoint); 0 = off.")
    document_masking: bool = Field(True, description="Mask attention across packed documents; positions "
                                                     "restart per document.")
    checkpoint_every: int = runtime_only(default=100, gt=0, description="Steps between resumable checkpoints.")
    keep_checkpoints: int = runtime_only(default=2, ge=1, description="Committed checkpoints kept.")
    log_every: int = runtime_only(default=10, gt=0, description="Steps between metric logs.")
    timeout_s: int = runtime_only(default=3600, gt=0, description="Kill the torchrun job after this long.")
    async_checkpoint: bool = runtime_only(default=False, description="dcp.async_save; commit after upload.")
    nnodes: str = runtime_only(default="1", description="torchrun --nnodes (e.g. 2 or 1:4 for elastic).")
    max_restarts: int = runtime_only(default=0, ge=0, description="torchrun --max-restarts.")
    rdzv_endpoint: str | None = runtime_only(default=None, description="host:port for multi-node rendezvous; "
                                                                        "empty = --standalone.")
    rdzv_id: str = runtime_only(default="codemill", description="Rendezvous job id (same on every node).")


class FinetuneConfig(StageConfig):
    """A short supervised fine-tune with the pipeline's trainer (rejection sampling, the warm start)."""

    max_steps: int = Field(50, ge=0, description="Optimizer steps (0 = off); the cap when epochs is set.")
    epochs: float | None = Field(None, gt=0, description="When set, the steps are this many passes over the packed "
                                 "rows (rounded up, at most max_steps): rejection sampling's data grows and shrinks "
                                 "with the pass rate, and a fixed step count would overfit a few passing samples.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (cosine decay to train.min_lr_ratio of it; "
                                              "the other AdamW settings are train's).")
    warmup_steps: int = Field(5, ge=0, description="Optimizer steps of linear lr warmup (at most max_steps).")
    micro_batch_size: int = Field(8, gt=0, description="Sequences per rank per optimizer step (no gradient "
                                                       "accumulation).")
    seq_len: int = Field(128, ge=8, description="Packed sequence length of the fine-tuning tokens.")


class VLLMOptions(StageConfig):
    """vLLM's settings when ``rl.rollout.engine`` or ``evaluate.engine`` is vllm (``models.engines.VLLMEngine``)."""

    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="The dtype vLLM runs the model in: its log-probs differ from the update's fp32 "
        "ones by this dtype's rounding (docs/rl.md#vllm has the measured gap); float32 narrows it.")
    gpu_memory_utilization: float = runtime_only(default=0.5, gt=0, le=1, description="Share of the GPU's "
                                                 "memory vLLM takes; the rest is the update's.")
    enforce_eager: bool = runtime_only(default=False, description="No CUDA graphs / compilation: a faster "
                                       "start, slower decoding (the tests' setting on CPU).")
