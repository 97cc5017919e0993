"""Typed recipe configuration: YAML recipe -> dataclasses -> flat CLI overrides.

Precedence is CLI > YAML > dataclass defaults. Every key lives in one section of the
recipe (`model`, `data`, `train`), and key names are unique across sections so that
`--key value` on the command line is never ambiguous. Anything unknown, mistyped or
contradictory raises `RecipeError` naming the key before any work starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "In a shocking discovery, scientists found that",
]


class RecipeError(ValueError):
    """A recipe or override that cannot describe a valid run."""


@dataclass
class SourceConfig:
    """One corpus in the data mixture."""

    # `builtin` (text every Python install has), `hub` (a Hub dataset) or `files` (local files).
    kind: str = "builtin"
    # builtin: `python-docs` or `python-stdlib`; hub: the dataset id, e.g. HuggingFaceFW/fineweb-edu.
    name: str = "python-docs"
    # Hub dataset configuration (subset), if it has several.
    config: str | None = None
    # Hub split to read.
    split: str = "train"
    # Column that holds the document text.
    column: str = "text"
    # Local files (globs) of .txt, .jsonl or .parquet; txt files are one document each.
    paths: list[str] = field(default_factory=list)
    # Relative share of this source in the mixture (normalised over all sources).
    weight: float = 1.0
    # Stream a Hub dataset instead of downloading it whole.
    streaming: bool = True
    # Stop reading this source after this many documents (0 = all).
    max_documents: int = 0


@dataclass
class ModelConfig:
    """The Llama architecture."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    # Round the embedding matrix up to a multiple of this (tensor-core friendly shapes).
    vocab_multiple: int = 1
    # Parameter count the recipe claims (0 = no claim); tests hold the recipe to it within 2%.
    expected_params: int = 0


@dataclass
class DataConfig:
    """Corpus, tokenizer and packed-sequence loading."""

    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    # Folder for the tokenizer, token shards and meta.json written by `hf-pretrain prepare`.
    data_dir: str = "data/smoke"
    # `train` fits a byte-level BPE on the corpus; otherwise a path to a saved tokenizer.
    tokenizer: str = "train"
    # Vocabulary size of the trained BPE (base tokens, merges and the end-of-text token).
    vocab_size: int = 4096
    # Extra special tokens added on top of `vocab_size` (e.g. chat markers).
    special_tokens: list[str] = field(default_factory=list)
    # Documents used to fit the tokenizer (0 = all).
    tokenizer_train_documents: int = 0
    # Stop preparing after this many training tokens (0 = the whole corpus).
    max_tokens: int = 0
    # Every `val_every`-th document goes to the validation split.
    val_every: int = 50
    # Tokens per shard file.
    shard_tokens: int = 50_000_000
    # Training context length; the loader packs `seq_len + 1` tokens per sample.
    seq_len: int = 128
    # DataLoader worker processes (>0 keeps data loading off the training thread).
    num_workers: int = 1
    # Copy shards into RAM instead of memory-mapping them.
    preload: bool = False


@dataclass
class TrainConfig:
    """Optimisation, precision, logging and checkpoints."""

    output_dir: str = "runs/smoke"
    seed: int = 1234
    max_steps: int = 100
    # Tokens per optimizer step across all processes; accumulation is derived from it.
    global_batch_tokens: int = 8192
    micro_batch_size: int = 8
    learning_rate: float = 1e-3
    # The cosine decays to learning_rate * min_lr_ratio.
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    # Clip the global gradient norm to this (0 = off).
    grad_clip: float = 1.0
    # `auto` (bf16 on a GPU that supports it, fp32 on CPU), `no`, `bf16` or `fp16`.
    mixed_precision: str = "auto"
    # Allow TF32 matmuls on CUDA (free speed on Ampere and later).
    tf32: bool = True
    compile: bool = False
    gradient_checkpointing: bool = False
    # Liger kernels (RMSNorm, SwiGLU, RoPE, fused linear cross entropy); CUDA only.
    liger: bool = False
    # `auto` (newest checkpoint in output_dir, if any), `none`, or a checkpoint folder.
    resume: str = "auto"
    save_interval: int = 100
    # End this invocation after this step with a checkpoint (0 = run to max_steps). The schedule
    # still spans max_steps, so a time-boxed session resumes exactly where it stopped.
    stop_at_step: int = 0
    # Checkpoints kept; older ones are deleted once a newer one is complete.
    keep_checkpoints: int = 2
    # Also keep every checkpoint at a multiple of this step, never pruned (0 = none).
    milestone_interval: int = 0
    # Consecutive non-finite steps (skipped, weights untouched) before the run stops.
    max_bad_steps: int = 3
    # Log a loss spike when a step's loss exceeds this multiple of the recent average.
    loss_spike_factor: float = 1.5
    # Rental price of the whole job in $/hour (all GPUs), for cost figures (0 = unknown).
    price_per_hour: float = 0.0
    # Expected throughput of the whole job, tokens/s, for time and cost estimates before
    # the run (0 = unknown; `hf-pretrain bench` measures it).
    expected_tokens_per_s: float = 0.0
    # Named phases by their last step, e.g. {smoke: 200, proof-of-life: 10000}: each gets a row
    # (loss drop, cost, cost per loss point) in phases.md when it ends.
    phases: dict[str, int] = field(default_factory=dict)
    # Stop (with a checkpoint and final/) when the last `early_stop_window` steps cost more than
    # this many dollars per loss point (0 = off; needs price_per_hour).
    early_stop_cost_per_loss_point: float = 0.0
    early_stop_window: int = 1000
    # Stop when validation loss has not improved by `early_stop_min_delta` for this many
    # evaluations in a row (0 = off).
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.01
    # Hub repo to publish to (empty = none): final/ goes to `main` at the end and, with
    # push_checkpoints, every checkpoint to a `step-N` branch as it is saved.
    push_to_hub: str = ""
    push_checkpoints: bool = False
    push_private: bool = False
    # lm-eval tasks scored (on `benchmark_limit` examples each) at every saved checkpoint into
    # benchmarks.jsonl (empty = none); `benchmark_data_dir` holds local ARC JSONL for offline tasks.
    benchmark_tasks: list[str] = field(default_factory=list)
    benchmark_limit: int = 50
    benchmark_data_dir: str | None = None
    eval_interval: int = 100
    # Validation batches (per process) per evaluation.
    eval_batches: int = 8
    log_interval: int = 10
    # `none`, `tensorboard`, `wandb` or `all`.
    report_to: str = "none"
    # Fixed prompts sampled greedily at every evaluation.
    prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    sample_max_new_tokens: int = 32


@dataclass
class Recipe:
    name: str = "custom"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

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
        """Hash of everything that shapes the math (not where files go or how often we log)."""
        d = self.to_dict()
        for volatile in ("output_dir", "resume", "report_to", "save_interval", "keep_checkpoints", "stop_at_step",
                         "milestone_interval", "max_bad_steps", "loss_spike_factor", "price_per_hour",
                         "expected_tokens_per_s", "phases", "early_stop_cost_per_loss_point", "early_stop_window",
                         "early_stop_patience", "early_stop_min_delta", "push_to_hub", "push_checkpoints",
                         "push_private", "benchmark_tasks", "benchmark_limit", "benchmark_data_dir",
                         "log_interval", "eval_interval", "max_steps"):
            d["train"].pop(volatile)
        d["data"].pop("num_workers")
        d["data"].pop("preload")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

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
        for key, value in [("max_steps", t.max_steps), ("micro_batch_size", t.micro_batch_size),
                           ("global_batch_tokens", t.global_batch_tokens), ("seq_len", d.seq_len),
                           ("save_interval", t.save_interval), ("log_interval", t.log_interval),
                           ("keep_checkpoints", t.keep_checkpoints), ("vocab_size", d.vocab_size),
                           ("val_every", d.val_every), ("vocab_multiple", m.vocab_multiple)]:
            if value <= 0:
                raise RecipeError(f"{key}={value} must be positive")
        if t.warmup_steps >= t.max_steps:
            raise RecipeError(f"warmup_steps={t.warmup_steps} must be smaller than max_steps={t.max_steps}")
        if not 0.0 <= t.min_lr_ratio <= 1.0:
            raise RecipeError(f"min_lr_ratio={t.min_lr_ratio} must lie in [0, 1]")
        if t.learning_rate <= 0:
            raise RecipeError(f"learning_rate={t.learning_rate} must be positive")
        for key, value in [("num_workers", d.num_workers), ("eval_interval", t.eval_interval),
                           ("eval_batches", t.eval_batches), ("max_tokens", d.max_tokens),
                           ("stop_at_step", t.stop_at_step), ("milestone_interval", t.milestone_interval),
                           ("price_per_hour", t.price_per_hour), ("expected_tokens_per_s", t.expected_tokens_per_s),
                           ("early_stop_cost_per_loss_point", t.early_stop_cost_per_loss_point),
                           ("early_stop_patience", t.early_stop_patience), ("early_stop_min_delta", t.early_stop_min_delta)]:
            if value < 0:
                raise RecipeError(f"{key}={value} must not be negative")
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


def _choice(key: str, value: str, allowed: list[str]) -> None:
    if value not in allowed:
        raise RecipeError(f"{key}={value!r} is not one of {', '.join(allowed)}")


# ---------------------------------------------------------------------- key tables
SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
TOP_LEVEL_KEYS = {"name": str, "description": str}


def _section_of_key() -> dict[str, str]:
    owner: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in owner, f"key {f.name} is defined in two sections"
            owner[f.name] = section
    return owner


KEY_SECTION = _section_of_key()


def _suggest(key: str, valid: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(key: str, value: Any, expected: Any) -> Any:
    """Check `value` against the annotation `expected`, converting only what is lossless."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        return coerce(key, value, inner[0])
    if origin is list:
        (item_type,) = typing.get_args(expected)
        if not isinstance(value, list):
            raise RecipeError(f"{key} must be a list, got {type(value).__name__} {value!r}")
        return [coerce(f"{key}[{i}]", v, item_type) for i, v in enumerate(value)]
    if origin is dict:
        key_type, value_type = typing.get_args(expected)
        if not isinstance(value, dict):
            raise RecipeError(f"{key} must be a mapping, got {type(value).__name__} {value!r}")
        return {coerce(f"{key} key", k, key_type): coerce(f"{key}.{k}", v, value_type) for k, v in value.items()}
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, dict):
            raise RecipeError(f"{key} must be a mapping, got {value!r}")
        return _build(expected, value, key)
    if expected is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif expected is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise RecipeError(f"{key} must be {getattr(expected, '__name__', expected)}, got {value!r}")


def _build(cls: type, values: dict[str, Any], where: str) -> Any:
    types_ = _field_types(cls)
    unknown = [k for k in values if k not in types_]
    if unknown:
        k = unknown[0]
        raise RecipeError(f"unknown key `{k}` in {where}{_suggest(k, types_)}")
    return cls(**{k: coerce(f"{where}.{k}", v, types_[k]) for k, v in values.items()})


# ---------------------------------------------------------------------- loading
def resolve_recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file {path} does not exist")
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        known = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
        raise RecipeError(f"no recipe named `{name_or_path}` in {RECIPES_DIR}{_suggest(name_or_path, known)}; "
                          f"known recipes: {', '.join(known)}")
    return candidate


def recipe_dict_from_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise RecipeError(f"{path} must hold a mapping of sections")
    valid = list(SECTIONS) + list(TOP_LEVEL_KEYS)
    for key, value in raw.items():
        if key not in valid:
            hint = f" (`{key}` belongs in the `{KEY_SECTION[key]}:` section)" if key in KEY_SECTION else _suggest(key, valid)
            raise RecipeError(f"unknown key `{key}` at the top of {path}{hint}")
        if key in SECTIONS and not isinstance(value or {}, dict):
            raise RecipeError(f"section `{key}` in {path} must be a mapping")
    return raw


def build_recipe(raw: dict[str, Any], overrides: dict[str, Any] | None = None, where: str = "recipe") -> Recipe:
    """Recipe from a YAML mapping plus flat overrides (`{"max_steps": 10}`), validated."""
    sections = {s: dict(raw.get(s) or {}) for s in SECTIONS}
    top = {k: raw[k] for k in TOP_LEVEL_KEYS if k in raw}
    for key, value in (overrides or {}).items():
        if key in TOP_LEVEL_KEYS:
            top[key] = value
        elif key in KEY_SECTION:
            sections[KEY_SECTION[key]][key] = value
        else:
            raise RecipeError(f"unknown key `{key}`{_suggest(key, list(KEY_SECTION) + list(TOP_LEVEL_KEYS))}")
    recipe = Recipe(
        **{k: coerce(k, v, str) for k, v in top.items()},
        **{s: _build(cls, sections[s], f"{where}:{s}") for s, cls in SECTIONS.items()},
    )
    recipe.validate()
    return recipe


def load_recipe(name_or_path: str, overrides: dict[str, Any] | None = None) -> Recipe:
    path = resolve_recipe_path(name_or_path)
    return build_recipe(recipe_dict_from_yaml(path), overrides, where=str(path))


def save_recipe(recipe: Recipe, path: str | os.PathLike) -> None:
    Path(path).write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))


# ---------------------------------------------------------------------- command line
def _cli_value(text: str) -> Any:
    """Parse a CLI string the way YAML would, so `--prompts '["a", "b"]'` and `--compile true` work."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """`--recipe` plus one `--key` per recipe field, documented with its default."""
    parser.add_argument("--recipe", default="smoke", help="recipe name in recipes/ or a path to a YAML file (default: smoke)")
    defaults = Recipe()
    for key in TOP_LEVEL_KEYS:
        parser.add_argument(f"--{key}", dest=key, default=None, metavar="VALUE",
                            help=f"(default: {getattr(defaults, key)!r})")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} keys")
        section_defaults = getattr(defaults, section)
        types_ = _field_types(cls)
        for f in dataclasses.fields(cls):
            default = getattr(section_defaults, f.name)
            if dataclasses.is_dataclass(typing.get_args(types_[f.name])[0] if typing.get_origin(types_[f.name]) is list else None):
                default = "[...]  (YAML/JSON list of sources)"
            group.add_argument(f"--{f.name}", dest=f.name, default=None, metavar="VALUE",
                               help=f"(default: {default})")


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    keys = list(TOP_LEVEL_KEYS) + list(KEY_SECTION)
    return {k: _cli_value(getattr(args, k)) for k in keys if getattr(args, k, None) is not None}


class RecipeArgumentParser(argparse.ArgumentParser):
    """argparse that names the nearest valid key for a typo and never abbreviates."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            bad = [a for a in message.split(":", 1)[1].split() if a.startswith("--")]
            if bad:
                key = bad[0][2:].split("=", 1)[0]
                valid = [a.lstrip("-") for a in self._option_string_actions if a.startswith("--")]
                message = f"unknown key `{key}`{_suggest(key, valid)}"
        super().error(message)


def parse_recipe_args(argv: list[str] | None, prog: str, description: str,
                      extra: typing.Callable[[argparse.ArgumentParser], None] | None = None
                      ) -> tuple[Recipe, argparse.Namespace]:
    parser = RecipeArgumentParser(prog=prog, description=description)
    if extra:
        extra(parser)
    add_recipe_arguments(parser)
    args = parser.parse_args(argv)
    try:
        recipe = load_recipe(args.recipe, overrides_from_args(args))
    except RecipeError as exc:
        parser.exit(2, f"{prog}: error: {exc}\n")
    return recipe, args
