"""The recipe's schema: typed sections of keys, each with its help and whether it changes the math.

Every key lives in one section (`model`, `data`, `train`) and key names are unique across sections,
so `--key value` on the command line is never ambiguous. `Recipe.validate` rejects contradictions
with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In a shocking discovery, scientists found that",
]


class RecipeError(ValueError):
    """A recipe or override that cannot describe a valid run."""


def key(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
        math: bool = True) -> Any:
    """A recipe key: its default, its `--help` text, and whether changing it changes the trained weights
    (`math=False`: where files go, how often we log or save, what we publish or measure on the side)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={"help": help, "math": math})


@dataclass
class SourceConfig:
    """One corpus in the data mixture."""

    kind: str = key("builtin", "`builtin` (text every Python install has), `hub` (a Hub dataset) or `files` (local files)")
    name: str = key("python-docs", "builtin: `python-docs` or `python-stdlib`; hub: the dataset id, e.g. HuggingFaceFW/fineweb-edu")
    config: str | None = key(None, "Hub dataset configuration (subset), if it has several")
    split: str = key("train", "Hub split to read")
    column: str = key("text", "column that holds the document text")
    paths: list[str] = key(factory=list, help="local files (globs) of .txt, .jsonl or .parquet; a txt file is one document")
    weight: float = key(1.0, "relative share of this source in the mixture (normalised over all sources)")
    streaming: bool = key(True, "stream a Hub dataset instead of downloading it whole")
    max_documents: int = key(0, "stop reading this source after this many documents (0 = all)")


@dataclass
class ModelConfig:
    """The Llama architecture."""

    hidden_size: int = key(128, "width of the residual stream")
    intermediate_size: int = key(384, "SwiGLU feed-forward width")
    num_hidden_layers: int = key(4, "decoder layers")
    num_attention_heads: int = key(4, "query heads")
    num_key_value_heads: int = key(2, "key/value heads (grouped-query attention when fewer than query heads)")
    max_position_embeddings: int = key(2048, "longest context the RoPE tables are built for")
    rope_theta: float = key(10000.0, "RoPE base frequency")
    rms_norm_eps: float = key(1e-5, "RMSNorm epsilon")
    initializer_range: float = key(0.02, "std of the normal weight init")
    tie_word_embeddings: bool = key(True, "the output projection shares the input embedding")
    # Tensor cores want matrix dimensions that are multiples of 8/64.
    vocab_multiple: int = key(1, "round the embedding rows up to a multiple of this")
    expected_params: int = key(0, "parameter count the recipe claims (0 = no claim); tests hold it to within 2%",
                               math=False)


@dataclass
class DataConfig:
    """Corpus, tokenizer and packed-sequence loading."""

    sources: list[SourceConfig] = key(factory=lambda: [SourceConfig()],
                                      help="the corpora of the mixture, a YAML/JSON list of mappings")
    data_dir: str = key("data/smoke", "folder for the tokenizer, token shards and meta.json written by `hf-pretrain prepare`",
                        math=False)
    tokenizer: str = key("train", "`train` fits a byte-level BPE on the corpus; otherwise a path to a saved tokenizer")
    vocab_size: int = key(4096, "vocabulary of the trained BPE (base tokens, merges and the end-of-text token)")
    special_tokens: list[str] = key(factory=list, help="extra special tokens added on top of vocab_size (e.g. chat markers)")
    tokenizer_train_documents: int = key(0, "documents used to fit the tokenizer (0 = all)")
    max_tokens: int = key(0, "stop preparing after this many training tokens (0 = the whole corpus)")
    val_every: int = key(50, "every val_every-th document goes to the validation split")
    shard_tokens: int = key(50_000_000, "tokens per shard file")
    seq_len: int = key(128, "training context length; the loader packs seq_len + 1 tokens per sample")
    num_workers: int = key(1, "DataLoader worker processes (>0 keeps data loading off the training thread)", math=False)
    preload: bool = key(False, "copy shards into RAM instead of memory-mapping them", math=False)


@dataclass
class TrainConfig:
    """Optimisation, precision, logging, checkpoints and what is published on the side."""

    output_dir: str = key("runs/smoke", "checkpoints, metrics, samples and final/ go here", math=False)
    seed: int = key(1234, "model init and data order")
    # The cosine schedule spans max_steps, so it shapes every step's learning rate.
    max_steps: int = key(100, "optimizer steps")
    global_batch_tokens: int = key(8192, "tokens per optimizer step across all processes; accumulation is derived from it")
    micro_batch_size: int = key(8, "sequences per forward pass on each process")
    learning_rate: float = key(1e-3, "peak learning rate")
    min_lr_ratio: float = key(0.1, "the cosine decays to learning_rate * min_lr_ratio")
    warmup_steps: int = key(10, "linear warmup steps")
    weight_decay: float = key(0.1, "AdamW decay on matrices only")
    adam_beta1: float = key(0.9, "AdamW first-moment decay")
    adam_beta2: float = key(0.95, "AdamW second-moment decay")
    adam_eps: float = key(1e-8, "AdamW denominator epsilon")
    grad_clip: float = key(1.0, "clip the global gradient norm to this (0 = off)")
    mixed_precision: str = key("auto", "`auto` (bf16 on a GPU that supports it, fp32 otherwise), `no`, `bf16` or `fp16`")
    tf32: bool = key(True, "allow TF32 matmuls on CUDA (free speed on Ampere and later)")
    compile: bool = key(False, "torch.compile the model")
    gradient_checkpointing: bool = key(False, "recompute activations in the backward pass to save memory")
    liger: bool = key(False, "Liger kernels (RMSNorm, SwiGLU, RoPE, fused linear cross entropy); CUDA only")
    resume: str = key("auto", "`auto` (newest good checkpoint in output_dir, if any), `none`, or a checkpoint folder",
                      math=False)
    save_interval: int = key(100, "checkpoint every this many steps", math=False)
    # The schedule still spans max_steps, so a time-boxed session resumes exactly where it stopped.
    stop_at_step: int = key(0, "end this invocation after this step with a checkpoint (0 = run to max_steps)",
                            math=False)
    keep_checkpoints: int = key(2, "checkpoints kept; older ones are deleted once a newer one is complete", math=False)
    milestone_interval: int = key(0, "also keep every checkpoint at a multiple of this step, never pruned (0 = none)",
                                  math=False)
    max_bad_steps: int = key(3, "consecutive non-finite steps (skipped, weights untouched) before the run stops",
                             math=False)
    loss_spike_factor: float = key(1.5, "log a loss spike when a step's loss exceeds this multiple of the recent average",
                                   math=False)
    price_per_hour: float = key(0.0, "rental price of the whole job in $/hour (all GPUs), for cost figures (0 = unknown)",
                                math=False)
    expected_tokens_per_s: float = key(0.0, "expected tokens/s of the whole job, for time and cost estimates before "
                                            "the run (0 = unknown; `hf-pretrain bench` measures it)", math=False)
    phases: dict[str, int] = key(factory=dict, math=False,
                                 help="named phases by their last step, e.g. {smoke: 200, proof-of-life: 10000}: each "
                                      "gets a row (loss drop, cost, cost per loss point) in phases.md when it ends")
    early_stop_cost_per_loss_point: float = key(0.0, "stop (with a checkpoint and final/) when the last "
                                                     "early_stop_window steps cost more than this many dollars per "
                                                     "loss point (0 = off; needs price_per_hour)", math=False)
    early_stop_window: int = key(1000, "steps in the early_stop_cost_per_loss_point window", math=False)
    early_stop_patience: int = key(0, "stop when validation loss has not improved by early_stop_min_delta for this "
                                      "many evaluations in a row (0 = off)", math=False)
    early_stop_min_delta: float = key(0.01, "the validation-loss improvement that counts for early_stop_patience",
                                      math=False)
    push_to_hub: str = key("", "Hub repo to publish to (empty = none): final/ goes to `main` at the end and, with "
                               "push_checkpoints, every checkpoint to a `step-N` branch as it is saved", math=False)
    push_checkpoints: bool = key(False, "push every checkpoint to a `step-N` branch of push_to_hub", math=False)
    push_private: bool = key(False, "create the push_to_hub repo private", math=False)
    benchmark_tasks: list[str] = key(factory=list, math=False,
                                     help="lm-eval tasks scored at every saved checkpoint into benchmarks.jsonl "
                                          "(empty = none)")
    benchmark_limit: int = key(50, "examples per benchmark task at each checkpoint", math=False)
    benchmark_data_dir: str | None = key(None, "folder of local ARC JSONL for the offline arc_*_local tasks",
                                         math=False)
    eval_interval: int = key(100, "validation loss and samples every this many steps", math=False)
    # Evaluation only reads the model, so none of the three keys below changes the weights.
    eval_batches: int = key(8, "validation batches (per process) per evaluation", math=False)
    log_interval: int = key(10, "a metrics.jsonl record every this many steps", math=False)
    report_to: str = key("none", "trackers: `none`, `tensorboard`, `wandb` or `all`", math=False)
    prompts: list[str] = key(factory=lambda: list(DEFAULT_PROMPTS), math=False,
                             help="fixed prompts sampled greedily at every evaluation")
    sample_max_new_tokens: int = key(32, "tokens generated per prompt", math=False)


@dataclass
class Recipe:
    name: str = key("custom", "the recipe's name", math=False)
    description: str = key("", "one line for the README's recipe table", math=False)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    # ------------------------------------------------------------------ derived values
    @property
    def tokens_per_micro_batch(self) -> int:
        return self.train.micro_batch_size * self.data.seq_len

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each process, for `world_size` processes."""
        per_pass = self.tokens_per_micro_batch * world_size
        if self.train.global_batch_tokens % per_pass:
            raise RecipeError(
                f"global_batch_tokens={self.train.global_batch_tokens} is not a multiple of "
                f"micro_batch_size * seq_len * processes = {self.train.micro_batch_size} * "
                f"{self.data.seq_len} * {world_size} = {per_pass}; change global_batch_tokens "
                f"or micro_batch_size"
            )
        return self.train.global_batch_tokens // per_pass

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Hash of the keys that change the math (each key's `math` metadata says whether it does)."""
        return hashlib.sha256(json.dumps(math_keys(self), sort_keys=True).encode()).hexdigest()[:16]

    def validate(self) -> None:
        m, d, t = self.model, self.data, self.train
        if m.hidden_size % m.num_attention_heads:
            raise RecipeError(f"hidden_size={m.hidden_size} must be divisible by num_attention_heads={m.num_attention_heads}")
        if m.num_attention_heads % m.num_key_value_heads:
            raise RecipeError(
                f"num_attention_heads={m.num_attention_heads} must be divisible by num_key_value_heads={m.num_key_value_heads}"
            )
        if d.seq_len > m.max_position_embeddings:
            raise RecipeError(f"seq_len={d.seq_len} exceeds max_position_embeddings={m.max_position_embeddings}")
        for name, value in [("max_steps", t.max_steps), ("micro_batch_size", t.micro_batch_size),
                            ("global_batch_tokens", t.global_batch_tokens), ("seq_len", d.seq_len),
                            ("save_interval", t.save_interval), ("log_interval", t.log_interval),
                            ("keep_checkpoints", t.keep_checkpoints), ("vocab_size", d.vocab_size),
                            ("val_every", d.val_every), ("vocab_multiple", m.vocab_multiple)]:
            if value <= 0:
                raise RecipeError(f"{name}={value} must be positive")
        if t.warmup_steps >= t.max_steps:
            raise RecipeError(f"warmup_steps={t.warmup_steps} must be smaller than max_steps={t.max_steps}")
        if not 0.0 <= t.min_lr_ratio <= 1.0:
            raise RecipeError(f"min_lr_ratio={t.min_lr_ratio} must lie in [0, 1]")
        if t.learning_rate <= 0:
            raise RecipeError(f"learning_rate={t.learning_rate} must be positive")
        for name, value in [("num_workers", d.num_workers), ("eval_interval", t.eval_interval),
                            ("eval_batches", t.eval_batches), ("max_tokens", d.max_tokens),
                            ("stop_at_step", t.stop_at_step), ("milestone_interval", t.milestone_interval),
                            ("price_per_hour", t.price_per_hour), ("expected_tokens_per_s", t.expected_tokens_per_s),
                            ("early_stop_cost_per_loss_point", t.early_stop_cost_per_loss_point),
                            ("early_stop_patience", t.early_stop_patience), ("early_stop_min_delta", t.early_stop_min_delta)]:
            if value < 0:
                raise RecipeError(f"{name}={value} must not be negative")
        if t.early_stop_cost_per_loss_point and not t.price_per_hour:
            raise RecipeError("early_stop_cost_per_loss_point needs price_per_hour: without a price there is no cost")
        if t.push_checkpoints and not t.push_to_hub:
            raise RecipeError("push_checkpoints needs push_to_hub: the repo id to push to")
        if t.early_stop_window <= 0:
            raise RecipeError(f"early_stop_window={t.early_stop_window} must be positive")
        for phase, end in t.phases.items():
            if not 0 < end <= t.max_steps:
                raise RecipeError(f"phases.{phase}={end} must be a step in 1..max_steps={t.max_steps}")
        if t.max_bad_steps < 1 or t.loss_spike_factor <= 1.0:
            raise RecipeError("max_bad_steps must be at least 1 and loss_spike_factor above 1")
        _choice("mixed_precision", t.mixed_precision, ["auto", "no", "bf16", "fp16"])
        _choice("report_to", t.report_to, ["none", "tensorboard", "wandb", "all"])
        if t.resume not in ("auto", "none") and not t.resume:
            raise RecipeError("resume must be `auto`, `none` or a checkpoint path")
        if not d.sources:
            raise RecipeError("data.sources is empty: name at least one corpus")
        for i, s in enumerate(d.sources):
            _choice(f"sources[{i}].kind", s.kind, ["builtin", "hub", "files"])
            if s.kind == "files" and not s.paths:
                raise RecipeError(f"sources[{i}] has kind `files` but no `paths`")
            if s.kind in ("builtin", "hub") and not s.name:
                raise RecipeError(f"sources[{i}] has kind `{s.kind}` but no `name`")
            if s.weight <= 0:
                raise RecipeError(f"sources[{i}].weight={s.weight} must be positive")
        # Fails early when the batch cannot be split into whole micro-batches on one process.
        self.grad_accum_steps(1)


def math_keys(config: Any) -> dict[str, Any]:
    """The keys of `config` (a section, a source or the whole recipe) that change the math, nested as in YAML."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out[f.name] = math_keys(value)
        elif f.metadata["math"]:
            is_list = isinstance(value, list)  # of sources: each source's own math keys
            out[f.name] = [math_keys(v) if dataclasses.is_dataclass(v) else v for v in value] if is_list else value
    return out


def _choice(name: str, value: str, allowed: list[str]) -> None:
    if value not in allowed:
        raise RecipeError(f"{name}={value!r} is not one of {', '.join(allowed)}")


# Which section holds each key: the YAML nests keys in sections, the command line names them flat.
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
TOP_LEVEL_KEYS = [f.name for f in dataclasses.fields(Recipe) if f.name not in SECTIONS]


def _section_of_key() -> dict[str, str]:
    owner: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in owner, f"key {f.name} is defined in two sections"
            owner[f.name] = section
    return owner


KEY_SECTION = _section_of_key()
