"""The recipe's schema: typed sections of keys, each with its help and whether it changes the math.

Every key lives in one section (`model`, `data`, `train`) and key names are unique across sections,
so `--key value` on the command line is never ambiguous. `Recipe.validate` rejects contradictions
with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In a shocking discovery, scientists found that",
]


class RecipeError(ValueError):
    """A recipe or override that cannot describe a valid run."""


def did_you_mean(name: str, valid: Iterable[str]) -> str:
    """` (did you mean `x`?)` for a mistyped name: its snake_case spelling if that is valid (`--max-steps`),
    else the closest spelling and the keys with `name` as one of their words (`price` -> `price_per_hour`),
    three at most; empty when none is near."""
    valid, wanted = list(valid), name.replace("-", "_")
    close = [wanted] if wanted in valid else difflib.get_close_matches(wanted, valid, n=1, cutoff=0.6)
    near = [f"`{n}`" for n in dict.fromkeys(close + [v for v in valid if wanted in v.split("_")])][:3]
    listed = " or ".join([", ".join(near[:-1]), near[-1]] if len(near) > 1 else near)
    return f" (did you mean {listed}?)" if near else ""


def key(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = dataclasses.MISSING,
    math: bool = True,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A recipe key: its default, its `--help` text, whether changing it changes the trained weights
    (`math=False`: where files go, how often we log or save, what we publish or measure on the side),
    and, for a number, its valid range (`ge`/`gt`: at least/above, `le`/`lt`: at most/below), which
    `Recipe.validate` checks before any work, naming the key."""
    bounds = {name: value for name, value in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if value is not None}
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"help": help, "math": math, "range": bounds}
    )


def range_text(bounds: dict[str, float]) -> str:
    """`[0, 1)`, `> 0`, `>= 1`: a key's valid range as people write it."""
    low = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    high = (bounds["le"], "]") if "le" in bounds else (bounds["lt"], ")") if "lt" in bounds else None
    if low and high:
        return f"in {low[0]}{_number(low[1])}, {_number(high[0])}{high[1]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    if high:
        return f"{'<=' if high[1] == ']' else '<'} {_number(high[0])}"
    return "any number"


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else f"{value:g}"


BOUND_CHECKS = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}


def check_ranges(config: Any, where: str = "") -> None:
    """Every numeric key of `config` (a section, a source, the whole recipe, nested) inside the range its
    metadata declares; a NaN is outside every range. Raises naming the first key that is not."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            check_ranges(value, where)
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_ranges(item, f"{where}{f.name}[{i}].")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and f.metadata.get("range"):
            if not all(BOUND_CHECKS[bound](value, limit) for bound, limit in f.metadata["range"].items()):
                allowed = range_text(f.metadata["range"])
                raise RecipeError(f"{where}{f.name}={value} must be {allowed}: {f.metadata['help']}")


# `name`'s default: the builtin corpus a bare `kind: builtin` reads. A files source whose name is this has
# none of its own (it is named after its files), so a recipe written before files took a name reads the same.
DEFAULT_SOURCE_NAME = "python-docs"


@dataclass
class SourceConfig:
    """One corpus in the data mixture."""

    kind: Literal["builtin", "hub", "files"] = key(
        "builtin", "`builtin` (text every Python install has), `hub` (a Hub dataset) or `files` (local files)"
    )
    name: str = key(
        DEFAULT_SOURCE_NAME,
        "builtin: `python-docs` or `python-stdlib`; hub: the dataset id, e.g. HuggingFaceFW/fineweb-edu; files: "
        "the source's name in the data folder (`sources/NN-name`) and in training's lines (unset: its first "
        "file's name, or its folder's for a glob)",
    )
    config: str | None = key(None, "Hub dataset configuration (subset), if it has several")
    split: str = key("train", "Hub split to read")
    column: str = key("text", "column that holds the document text")
    paths: list[str] = key(
        factory=list,
        help="local files (globs): .jsonl or .parquet (a document per row, from `column`) or text (.txt, .md, "
        "...; .gz too). A text file is one document, except a .txt that holds <|endoftext|> (split there) or, "
        "without it, is over 1 MB (a book, a dump: split at each blank line)",
    )
    weight: float = key(
        1.0,
        "relative share of this source in the training batches (normalised over all sources; no re-prepare); "
        "0 with a decay_weight: a decay-only source, drawn from the decay on",
        ge=0,
    )
    decay_weight: float | None = key(
        None,
        "its share from the first step of a wsd decay or a cooldown on (annealing on the best data); null = `weight`",
        gt=0,
    )
    tasks: int = key(
        0, "`prepare` tasks for this source (0 = one per file; 1 for a builtin or a Hub dataset)", math=False, ge=0
    )
    streaming: bool = key(True, "stream a Hub dataset instead of downloading it whole")
    max_documents: int = key(0, "stop reading this source after this many documents (0 = all)", ge=0)


@dataclass
class ModelConfig:
    """The Llama architecture."""

    # Checked-and-refused rather than ignored: every consumer of these keys (the doctor's memory, plan's
    # FLOPs and cost, the resume shape check) then describes the model that actually trains.
    init_from: str = key(
        "",
        "start from a published model's weights instead of random ones (empty = random init): a Hub id "
        "(through huggingface_hub's cache; HF_HUB_OFFLINE=1 reads only the cache) or a local "
        "LlamaForCausalLM folder (an `hf-pretrain export`). The model is built from its config.json, "
        "which must agree with the model keys below: a difference is refused before any work, naming "
        "each key and its flag. `tokenizer` must be its tokenizer, with vocab_size its size",
    )
    hidden_size: int = key(128, "width of the residual stream", ge=1)
    intermediate_size: int = key(384, "SwiGLU feed-forward width", ge=1)
    num_hidden_layers: int = key(4, "decoder layers", ge=1)
    num_attention_heads: int = key(4, "query heads", ge=1)
    num_key_value_heads: int = key(2, "key/value heads (grouped-query attention when fewer than query heads)", ge=1)
    max_position_embeddings: int = key(2048, "longest context the RoPE tables are built for", ge=1)
    rope_theta: float = key(10000.0, "RoPE base frequency", gt=0)
    rms_norm_eps: float = key(1e-5, "RMSNorm epsilon", gt=0)
    initializer_range: float = key(0.02, "std of the normal weight init", gt=0)
    tie_word_embeddings: bool = key(True, "the output projection shares the input embedding")
    # Tensor cores want matrix dimensions that are multiples of 8/64.
    vocab_multiple: int = key(1, "round the embedding rows up to a multiple of this", ge=1)
    expected_params: int = key(
        0, "parameter count the recipe claims (0 = no claim); tests hold it to within 2%", math=False, ge=0
    )


@dataclass
class DataConfig:
    """Corpus, tokenizer and packed-sequence loading."""

    sources: list[SourceConfig] = key(
        factory=lambda: [SourceConfig()], help="the corpora of the mixture, a YAML/JSON list of mappings"
    )
    data_dir: str = key(
        "data/smoke",
        "folder for the tokenizer, token shards and meta.json written by `hf-pretrain prepare`",
        math=False,
    )
    tokenizer: str = key(
        "train",
        "`train` fits a byte-level BPE on the corpus; otherwise a saved tokenizer, used as it is: a local "
        "folder (a model folder too), a tokenizer.json, or a Hub id (through huggingface_hub's cache)",
    )
    vocab_size: int = key(
        4096,
        "vocabulary of the trained BPE (base tokens, merges and the end-of-text token); with a saved "
        "tokenizer, its size (without special_tokens)",
        ge=257,
    )
    special_tokens: list[str] = key(
        factory=list, help="extra special tokens added on top of vocab_size (e.g. chat markers)"
    )
    language: list[str] = key(
        factory=lambda: ["en"],
        math=False,
        help="ISO 639-1 codes of the corpus's languages, for the model card's `language`",
    )
    tokenizer_train_documents: int = key(0, "documents used to fit the tokenizer (0 = all)", ge=0)
    max_tokens: int = key(0, "stop preparing after this many training tokens (0 = the whole corpus)", ge=0)
    val_every: int = key(50, "every val_every-th document goes to the validation split", ge=2)
    executor: Literal["local", "slurm", "ray"] = key(
        "local", "where `prepare` runs datatrove: `local` (this machine), `slurm` (a job array) or `ray`", math=False
    )
    workers: int = key(0, "`prepare` tasks run at once (0 = every core here; slurm: no limit)", math=False, ge=0)
    slurm_partition: str = key("", "slurm: the partition the array job runs in", math=False)
    slurm_time: str = key("12:00:00", "slurm: time limit of each task", math=False)
    slurm_cpus_per_task: int = key(1, "slurm: cores per task (each task tokenizes on one)", math=False, ge=1)
    ray_address: str = key("auto", "ray: the address of an existing cluster", math=False)
    seq_len: int = key(128, "training context length; the loader packs seq_len + 1 tokens per sample", ge=1)
    num_workers: int = key(
        1, "DataLoader worker processes (>0 keeps data loading off the training thread)", math=False, ge=0
    )
    preload: bool = key(False, "copy shards into RAM instead of memory-mapping them", math=False)


@dataclass
class TrainConfig:
    """Optimisation, precision, logging, checkpoints and what is published on the side."""

    output_dir: str = key(
        "runs/smoke",
        "checkpoints, metrics, samples and final/ go here: a local folder, or an object-store URL "
        "(s3://BUCKET/PREFIX, gs://, hf://) trained through a local copy and resumable from any machine",
        math=False,
    )
    cache_dir: str | None = key(
        None,
        "where the local copy of a URL output_dir lives (unset: $HF_PRETRAIN_HOME, else ~/.cache/hf_pretrain)",
        math=False,
    )
    store_wait_s: float = key(
        300,
        "a URL output_dir: how long the end of a run, a stop or a SIGTERM waits for the uploads to finish",
        math=False,
        ge=0,
    )
    store_heartbeat_s: float = key(
        30,
        "a URL output_dir: the lease's heartbeat; another machine takes over after 3 missed heartbeats",
        math=False,
        gt=0,
    )
    seed: int = key(1234, "model init and data order", ge=0, lt=2**32)
    # A cosine spans max_steps, so it shapes every step's learning rate; a wsd only its final decay.
    max_steps: int = key(100, "optimizer steps", ge=1)
    global_batch_tokens: int = key(
        8192, "tokens per optimizer step across all processes; accumulation is derived from it", ge=1
    )
    micro_batch_size: int = key(8, "sequences per forward pass on each process", ge=1)
    learning_rate: float = key(1e-3, "peak learning rate", gt=0, le=1)
    min_lr_ratio: float = key(0.1, "the schedule (and any cooldown) decays to learning_rate * min_lr_ratio", ge=0, le=1)
    warmup_steps: int = key(
        10, "linear warmup steps (at or above max_steps: the whole run warms up, with a warning)", ge=0
    )
    lr_schedule: Literal["cosine", "wsd"] = key(
        "cosine",
        "`cosine` (warmup, then a cosine over max_steps) or `wsd` (warmup, the peak held, "
        "a final decay): a wsd run can stop with a finished model at any step and go "
        "further later",
    )
    decay_fraction: float = key(
        0.2,
        "wsd: share of max_steps spent in the final decay; also the default cooldown of "
        "`hf-pretrain stop`, as a share of the steps done",
        ge=0,
        le=1,
    )
    decay_shape: Literal["linear", "1-sqrt"] = key(
        "1-sqrt", "wsd decay and cooldowns: `linear` or `1-sqrt` (falls fast, then flattens)"
    )
    # Muon (orthogonalised momentum) on the decoder's 2-D matrices, AdamW on the rest: nanochat's split.
    optimizer: Literal["adamw", "muon"] = key(
        "adamw",
        "`adamw` for every tensor, or `muon`: torch.optim.Muon on the decoder's 2-D weight matrices "
        "(attention and MLP projections), AdamW on the embedding, head and norms",
    )
    muon_learning_rate: float = key(
        0.0,
        "muon: the matrices' peak rate (0 = learning_rate; Muon's updates are scaled to AdamW's RMS, "
        "so AdamW's rate carries over); the schedule scales both rates alike",
        ge=0,
        le=1,
    )
    muon_momentum: float = key(0.95, "muon: momentum of the matrices (Nesterov)", ge=0, lt=1)
    weight_decay: float = key(0.1, "decoupled decay on matrices only (AdamW's and Muon's alike)", ge=0)
    adam_beta1: float = key(0.9, "AdamW first-moment decay", ge=0, lt=1)
    adam_beta2: float = key(0.95, "AdamW second-moment decay", ge=0, lt=1)
    adam_eps: float = key(1e-8, "AdamW denominator epsilon", gt=0)
    grad_clip: float = key(1.0, "clip the global gradient norm to this (0 = off)", ge=0)
    mixed_precision: Literal["auto", "no", "bf16", "fp16", "fp8"] = key(
        "auto",
        "`auto` (bf16 on a GPU that supports it, fp32 otherwise), `no`, `bf16`, `fp16` or `fp8` (the decoder's "
        "linear layers; compute capability 8.9+)",
    )
    # fp8: the decoder's linear layers in torchao's float8 (hf_pretrain/fp8.py); the rest as bf16 runs it.
    fp8_recipe: Literal["tensorwise", "rowwise"] = key(
        "tensorwise",
        "fp8: torchao's scaling, `tensorwise` (one scale per tensor, the fastest) or `rowwise` (one per row, "
        "finer for outliers, slower)",
    )
    fp8_emulate: bool = key(
        False,
        "fp8: emulate the scaled matmuls in fp32 (the same casts and scales), so the FP8 math runs on a CPU "
        "or a GPU older than compute capability 8.9: for tests and quality proxies, never faster",
        math=False,
    )
    # Which SDPA kernel the attention prefers (hf_pretrain/attention.py); the check measures them all.
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = key(
        "auto",
        "SDPA's kernel: `auto` (the fastest `hf-pretrain check` measured on this card when it has, else torch's "
        "own choice), `flash`, `efficient`, `cudnn` or `math`; the same function, other speed",
        math=False,
    )
    tf32: bool = key(True, "allow TF32 matmuls on CUDA (free speed on Ampere and later)")
    compile: bool = key(False, "torch.compile the model (inductor; on the CPU too, where it builds C++ kernels)")
    compile_regions: bool = key(
        False,
        "with compile: compile one decoder layer and reuse it for all (Accelerate's "
        "regional compilation): the compile time stops growing with depth, but the "
        "head and loss run uncompiled",
    )
    gradient_checkpointing: bool = key(False, "recompute activations in the backward pass to save memory")
    # Selective checkpointing: a card a few GB short recomputes a few layers, not all of them.
    checkpointed_layers: int = key(
        -1,
        "decoder layers that recompute their activations in the backward pass (0 = none, "
        "num_hidden_layers = all); -1: all when gradient_checkpointing is true, else none",
        math=False,
        ge=-1,
    )
    liger: bool = key(False, "Liger kernels (RMSNorm, SwiGLU, RoPE, fused linear cross entropy); CUDA only")
    chunked_loss: bool = key(
        False,
        "the head's matmul and log-softmax a chunk of tokens at a time (hf_pretrain/loss.py): the backward "
        "keeps no [tokens, vocabulary] logits (their gradients are computed chunk by chunk in the forward)",
    )
    resume: str = key(
        "auto", "`auto` (newest good checkpoint in output_dir, if any), `none`, or a checkpoint folder", math=False
    )
    allow_schedule_change: bool = key(
        False,
        "resume a cosine run under another max_steps or schedule although every "
        "later step's learning rate changes (the log says how)",
        math=False,
    )
    allow_recipe_change: bool = key(
        False,
        "resume under another global_batch_tokens or seq_len: the data position is recomputed in tokens",
        math=False,
    )
    allow_data_change: bool = key(
        False,
        "resume on training shards other than the checkpoint's (same tokenizer): the card records the step "
        "where the data changed. Another tokenizer is always refused",
        math=False,
    )
    save_interval: int = key(100, "checkpoint every this many steps", math=False, ge=1)
    # The schedule still spans max_steps, so a time-boxed session resumes exactly where it stopped.
    stop_at_step: int = key(
        0, "end this invocation after this step with a checkpoint (0 = run to max_steps)", math=False, ge=0
    )
    keep_checkpoints: int = key(
        2, "checkpoints kept; older ones are deleted once a newer one is complete", math=False, ge=1
    )
    milestone_interval: int = key(
        0, "also keep every checkpoint at a multiple of this step, never pruned (0 = none)", math=False, ge=0
    )
    milestone_full_state: bool = key(
        False,
        "keep milestones whole (resumable: optimizer and RNG too, ~6x the bytes) "
        "rather than their bf16 weights, which export, eval and the demo read",
        math=False,
    )
    async_save: bool = key(
        True,
        "a periodic save copies the model and optimizer states to host memory and writes them in the "
        "background (one training state of host memory); false writes them while training waits. "
        "FSDP always writes while training waits",
        math=False,
    )
    max_bad_steps: int = key(
        3, "consecutive non-finite steps (skipped, weights untouched) before the run stops", math=False, ge=1
    )
    loss_spike_factor: float = key(
        1.5, "log a loss spike when a step's loss exceeds this multiple of the recent average", math=False, gt=1
    )
    # Sized for the 1b on one GPU: a step is 131K tokens at ~6.2 GFLOPs each, ~2 s at 40% MFU on an
    # H100 and ~6 s on an A100; its 12.5 GB checkpoint takes about 2 minutes at 100 MB/s, an evaluation
    # well under one (estimates from the sizes, not measurements). 600 s is far above all of them, and
    # a hang costs at most ten minutes. Collectives time out 60 s later (training/watchdog.py), so the
    # watchdog, which writes the stacks, always speaks first.
    hang_timeout_s: float = key(
        600.0,
        "seconds without progress (an optimizer step, a checkpoint save or an evaluation completing) after "
        "which the run counts as hung: every process that can writes its threads' stacks into hangs/, "
        "status.json says `hung`, and the run exits 69 (0 = off, e.g. under a debugger). The default fits the 1b "
        "on a GPU with room to spare: a step takes ~2-6 s on an H100/A100, its 12.5 GB checkpoint ~2 min at "
        "100 MB/s (estimates)",
        math=False,
        ge=0,
    )
    price_per_hour: float = key(
        0.0, "rental price of the whole job in $/hour (all GPUs), for cost figures (0 = unknown)", math=False, ge=0
    )
    expected_tokens_per_s: float = key(
        0.0,
        "expected tokens/s of the whole job, for time and cost estimates before "
        "the run (0 = unknown; `hf-pretrain bench` measures it)",
        math=False,
        ge=0,
    )
    phases: dict[str, int] = key(
        factory=dict,
        math=False,
        help="named phases by their last step, e.g. {smoke: 200, proof-of-life: 10000}: each "
        "gets a row (loss drop, cost, cost per loss point) in phases.md when it ends",
    )
    early_stop_cost_per_loss_point: float = key(
        0.0,
        "stop (with a checkpoint and final/) when the last "
        "early_stop_window steps cost more than this many dollars per "
        "loss point (0 = off; needs price_per_hour)",
        math=False,
        ge=0,
    )
    early_stop_window: int = key(1000, "steps in the early_stop_cost_per_loss_point window", math=False, ge=1)
    early_stop_patience: int = key(
        0,
        "stop when validation loss has not improved by early_stop_min_delta for this "
        "many evaluations in a row (0 = off)",
        math=False,
        ge=0,
    )
    early_stop_min_delta: float = key(
        0.01, "the validation-loss improvement that counts for early_stop_patience", math=False, ge=0
    )
    push_to_hub: str = key(
        "",
        "Hub repo to publish to (empty = none): final/ goes to `main` at the end and, with "
        "push_checkpoints, every checkpoint to a `step-N` branch as it is saved",
        math=False,
    )
    push_checkpoints: bool = key(False, "push every checkpoint to a `step-N` branch of push_to_hub", math=False)
    push_private: bool = key(False, "create the push_to_hub repo private", math=False)
    benchmark_tasks: list[str] = key(
        factory=list,
        math=False,
        help="lm-eval tasks scored at every saved checkpoint into benchmarks.jsonl (empty = none)",
    )
    benchmark_limit: int = key(50, "examples per benchmark task at each checkpoint", math=False, ge=1)
    benchmark_data_dir: str | None = key(
        None, "folder of local ARC JSONL for the offline arc_*_local tasks", math=False
    )
    eval_interval: int = key(100, "validation loss and samples every this many steps", math=False, ge=0)
    # Evaluation only reads the model, so none of the three keys below changes the weights.
    eval_tokens: int = key(
        8192,
        "validation tokens per evaluation (whole sequences of seq_len, the first ones of "
        "the split), the same whatever the number of processes",
        math=False,
        ge=1,
    )
    log_interval: int = key(10, "a metrics.jsonl record every this many steps", math=False, ge=1)
    report_to: str = key(
        "none",
        "experiment trackers, comma-separated: any Accelerate supports (`tensorboard`, `trackio`, `wandb`, "
        "`mlflow`, ...), `all` (every one installed) or `none`",
        math=False,
    )
    prompts: list[str] = key(
        factory=lambda: list(DEFAULT_PROMPTS), math=False, help="fixed prompts sampled greedily at every evaluation"
    )
    sample_max_new_tokens: int = key(32, "tokens generated per prompt", math=False, ge=1)

    @property
    def effective_warmup_steps(self) -> int:
        """`warmup_steps`, or the whole run when it is not shorter (see `Recipe.notes`)."""
        return min(self.warmup_steps, self.max_steps)

    @property
    def run_phases(self) -> dict[str, int]:
        """The named phases that end within max_steps; a shortened run drops the others (see `Recipe.notes`)."""
        return {name: end for name, end in self.phases.items() if end <= self.max_steps}


@dataclass
class Recipe:
    name: str = key("custom", "the recipe's name", math=False)
    description: str = key("", "one line for the README's recipe table", math=False)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)

    # ------------------------------------------------------------------ derived values
    @property
    def checkpointed_layer_count(self) -> int:
        """How many decoder layers recompute their activations: `checkpointed_layers`, or, left at -1,
        all of them with gradient_checkpointing and none without."""
        if self.train.checkpointed_layers >= 0:
            return self.train.checkpointed_layers
        return self.model.num_hidden_layers if self.train.gradient_checkpointing else 0

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

    def notes(self) -> list[str]:
        """What a shortened run leaves out, one labelled line each ("note: ...", "warning: ...") for the
        log and the doctor: overrides a user expects to work."""
        t, out = self.train, []
        dropped = sorted(set(t.phases) - set(t.run_phases), key=t.phases.get)
        if dropped:
            out.append(
                f"note: max_steps={t.max_steps} ends before phase(s) {', '.join(f'{p} (step {t.phases[p]})' for p in dropped)}: "
                f"dropped from phases.md"
            )
        if t.warmup_steps >= t.max_steps:
            out.append(
                f"warning: warmup_steps={t.warmup_steps} is not below max_steps={t.max_steps}: the learning rate "
                f"warms up over the whole run and never decays"
            )
        return out

    def validate(self) -> None:
        check_ranges(self)  # each key alone first; then how keys relate
        m, d, t = self.model, self.data, self.train
        if m.hidden_size % m.num_attention_heads:
            raise RecipeError(
                f"hidden_size={m.hidden_size} must be divisible by num_attention_heads={m.num_attention_heads}"
            )
        if m.num_attention_heads % m.num_key_value_heads:
            raise RecipeError(
                f"num_attention_heads={m.num_attention_heads} must be divisible by num_key_value_heads={m.num_key_value_heads}"
            )
        # init_from with `tokenizer: train` is judged on the tokenizers themselves: data an export's own run
        # trained on carries that export's tokenizer (the data check compares their hashes); `prepare`
        # refuses to fit a new BPE for an init_from run.
        if m.init_from and d.special_tokens:
            raise RecipeError(
                f"special_tokens {d.special_tokens} with init_from: the base model's embedding has no rows "
                f"for tokens added to its tokenizer; drop special_tokens"
            )
        if d.seq_len > m.max_position_embeddings:
            raise RecipeError(f"seq_len={d.seq_len} exceeds max_position_embeddings={m.max_position_embeddings}")
        if t.early_stop_cost_per_loss_point and not t.price_per_hour:
            raise RecipeError("early_stop_cost_per_loss_point needs price_per_hour: without a price there is no cost")
        if t.push_checkpoints and not t.push_to_hub:
            raise RecipeError("push_checkpoints needs push_to_hub: the repo id to push to")
        for phase, end in t.phases.items():  # past max_steps is fine: a shortened run drops them (`notes`)
            if end <= 0:
                raise RecipeError(f"phases.{phase}={end} must be a step, 1 or more")
        if t.checkpointed_layers > m.num_hidden_layers:
            raise RecipeError(
                f"checkpointed_layers={t.checkpointed_layers} exceeds num_hidden_layers={m.num_hidden_layers}: "
                f"set --checkpointed_layers {m.num_hidden_layers} (all) or fewer"
            )
        if t.compile_regions and not t.compile:
            raise RecipeError("compile_regions=true needs compile=true (it says how to compile, not whether)")
        if t.mixed_precision == "fp8":  # torch._scaled_mm takes FP8 operands whose dimensions are multiples of 16
            kv_width = m.num_key_value_heads * (m.hidden_size // m.num_attention_heads)
            widths = {
                "hidden_size": m.hidden_size,
                "intermediate_size": m.intermediate_size,
                "key/value width": kv_width,
            }
            odd = [f"{name}={value}" for name, value in widths.items() if value % 16]
            if odd:
                raise RecipeError(
                    f"mixed_precision=fp8 needs the decoder's widths to be multiples of 16 (torch._scaled_mm); "
                    f"{', '.join(odd)} is not: change it, or --mixed_precision bf16"
                )
        if t.chunked_loss and t.liger:
            raise RecipeError(
                "chunked_loss=true with liger=true: Liger's fused loss already keeps the logits out of memory; "
                "set --chunked_loss false (or --liger false)"
            )
        check_trackers(t.report_to)
        if t.resume not in ("auto", "none") and not t.resume:
            raise RecipeError("resume must be `auto`, `none` or a checkpoint path")
        if not d.sources:
            raise RecipeError("data.sources is empty: name at least one corpus")
        if d.executor == "slurm" and not d.slurm_partition:
            raise RecipeError("executor=slurm needs slurm_partition: the partition the array job runs in")
        for i, s in enumerate(d.sources):
            if s.kind == "files" and not s.paths:
                raise RecipeError(f"sources[{i}] has kind `files` but no `paths`")
            if s.kind in ("builtin", "hub") and not s.name:
                raise RecipeError(f"sources[{i}] has kind `{s.kind}` but no `name`")
            if s.weight == 0 and s.decay_weight is None:
                raise RecipeError(
                    f"sources[{i}] has weight 0 and no decay_weight: it would never be drawn; give it a weight, "
                    f"or a decay_weight to draw it from the decay on (a decay-only source), or leave it out"
                )
        if not any(s.weight for s in d.sources):
            raise RecipeError("every source has weight 0: at least one must be drawn from the first step")
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


def tracker_names(report_to: str) -> list[str]:
    """`report_to` as Accelerate's `log_with` takes it: `tensorboard,trackio` -> both names; `none` -> []."""
    names = [name.strip() for name in report_to.split(",")]
    return [] if names == ["none"] else names


def check_trackers(report_to: str) -> None:
    """Each name one Accelerate knows (`accelerate.utils.LoggerType`, so a tracker it adds is accepted here
    too); whether it is installed is the doctor's question (preflight/trackers.py)."""
    names = tracker_names(report_to)
    if not names:
        return
    from accelerate.utils import LoggerType  # here, not above: it imports torch, which `none` never needs

    known = [tracker.value for tracker in LoggerType]
    for name in names:
        if name not in known:
            raise RecipeError(
                f"report_to={report_to!r}: `{name}` is not a tracker Accelerate knows{did_you_mean(name, known)}; "
                f"give `none`, or one or more of {', '.join(known)}, comma-separated"
            )


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
