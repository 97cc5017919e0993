"""The recipe: its sections, each typed in a module of its own beside the others in `config/`, and the
checks of how keys of different sections relate.

A section is the settings one part of the product owns: `model` (the architecture), `data` (corpora,
tokenizer, loading), `train` (the run: its folder, seed, length, batch), `optim` (optimizer and
schedule), `compute` (precision, kernels, compilation, recomputation), `checkpoints` (saving, keeping,
resuming), `store` (a run in object storage), `stopping` (every reason to end early), `evaluation`
(validation, samples, lm-eval tasks), `publish` (the Hub) and `reporting` (metrics, trackers, price,
phases). Key names are unique across sections, so `--key value` on the command line is never ambiguous
and a key can move between sections without breaking a command. Recipes written before the sections
(every run-time key under `train:`) still load (`legacy_layout`). `Recipe.validate` rejects
contradictions with a message that says what to change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .checkpoints_section import CheckpointConfig
from .compute_section import SCALED_MATMUL_CHOICES, SCALED_MATMUL_MULTIPLE, ComputeConfig
from .data_section import DataConfig
from .evaluation_section import EvaluationConfig
from .keys import RecipeError, check_ranges, did_you_mean, key, math_keys
from .model_section import ModelConfig
from .optim_section import OptimConfig
from .publish_section import PublishConfig
from .reporting_section import ReportingConfig
from .stopping_section import StoppingConfig
from .store_section import StoreConfig
from .train_section import TrainConfig


@dataclass(frozen=True)
class StepAsWritten:
    """What a recipe says of one optimizer step before a machine resolves its words (`auto` precision,
    Liger without CUDA): the `compute` section, the optimizer, the micro-batch and how many layers
    recompute. All that `machine/run_profile.run_profile` reads of a recipe."""

    compute: ComputeConfig
    optimizer: str
    micro_batch_size: int
    checkpointed_layers: int


@dataclass
class Recipe:
    name: str = key("custom", "the recipe's name", math=False)
    description: str = key("", "one line for the README's recipe table", math=False)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    compute: ComputeConfig = dataclasses.field(default_factory=ComputeConfig)
    checkpoints: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    stopping: StoppingConfig = dataclasses.field(default_factory=StoppingConfig)
    evaluation: EvaluationConfig = dataclasses.field(default_factory=EvaluationConfig)
    publish: PublishConfig = dataclasses.field(default_factory=PublishConfig)
    reporting: ReportingConfig = dataclasses.field(default_factory=ReportingConfig)

    def replace(self, **keys: Any) -> Recipe:
        """A copy with `keys` (flat names, as on the command line) changed in whichever section owns each:
        `recipe.replace(micro_batch_size=4, checkpointed_layers=2)`."""
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in keys.items():
            if name not in KEY_SECTION:
                raise RecipeError(f"unknown key `{name}`{did_you_mean(name, KEY_SECTION)}")
            by_section.setdefault(KEY_SECTION[name], {})[name] = value
        changed = {s: dataclasses.replace(getattr(self, s), **values) for s, values in by_section.items()}
        return dataclasses.replace(self, **changed)

    def sections(self, *names: str) -> dict[str, Any]:
        """The sections `names`, by name: what a part built from its own sections is handed by keyword
        (`built_step(profile, **recipe.sections("model", "data", "train", "optim", "compute"))`)."""
        unknown = [name for name in names if name not in SECTIONS]
        if unknown:
            raise ValueError(f"no section named {', '.join(unknown)}")
        return {name: getattr(self, name) for name in names}

    def value(self, name: str) -> Any:
        """A key's value by its flat name, wherever its section is (`name` and `description` too)."""
        return getattr(self, name) if name in TOP_LEVEL_KEYS else getattr(getattr(self, KEY_SECTION[name]), name)

    # ------------------------------------------------------------------ derived values
    @property
    def checkpointed_layer_count(self) -> int:
        """How many decoder layers recompute their activations: `checkpointed_layers`, or, left at -1,
        all of them with gradient_checkpointing and none without."""
        if self.compute.checkpointed_layers >= 0:
            return self.compute.checkpointed_layers
        return self.model.num_hidden_layers if self.compute.gradient_checkpointing else 0

    @property
    def step_as_written(self) -> StepAsWritten:
        """The step as this recipe writes it, for a run profile (a door's or a what-if's) to resolve."""
        return StepAsWritten(
            self.compute, self.optim.optimizer, self.train.micro_batch_size, self.checkpointed_layer_count
        )

    @property
    def effective_warmup_steps(self) -> int:
        """`warmup_steps`, or the whole run when it is not shorter (see `notes`)."""
        return self.optim.warmup_within(self.train.max_steps)

    @property
    def run_phases(self) -> dict[str, int]:
        """The named phases that end within max_steps; a shortened run drops the others (see `notes`)."""
        return {name: end for name, end in self.reporting.phases.items() if end <= self.train.max_steps}

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.train.micro_batch_size * self.data.seq_len

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each process, for `world_size` processes."""
        return grad_accum_steps(self.train, world_size, seq_len=self.data.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Hash of the keys that change the math (each key's `math` metadata says whether it does), over
        the layout before the sections (`model`, `data`, and every other key under `train`), so a
        checkpoint's fingerprint from before them still matches the same recipe."""
        keys = math_keys(self)
        layout = {"model": keys.pop("model"), "data": keys.pop("data")}
        layout["train"] = {name: value for section in keys.values() for name, value in section.items()}
        return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()[:16]

    def notes(self) -> list[str]:
        """What a shortened run leaves out, one labelled line each ("note: ...", "warning: ...") for the
        log and the doctor: overrides a user expects to work."""
        phases, max_steps, warmup, out = self.reporting.phases, self.train.max_steps, self.optim.warmup_steps, []
        dropped = sorted(set(phases) - set(self.run_phases), key=phases.get)
        if dropped:
            out.append(
                f"note: max_steps={max_steps} ends before phase(s) {', '.join(f'{p} (step {phases[p]})' for p in dropped)}: "
                f"dropped from phases.md"
            )
        if warmup >= max_steps:
            out.append(
                f"warning: warmup_steps={warmup} is not below max_steps={max_steps}: the learning rate "
                f"warms up over the whole run and never decays"
            )
        return out

    def validate(self) -> None:
        check_ranges(self)  # each key alone first; then how keys relate
        _check_places(self.train, self.data, name=self.name)
        _check_model(self.model)
        _check_data(self.data, self.model)
        _check_compute(self.compute, self.model)
        _check_side_work(self.stopping, self.publish, self.reporting)
        if self.checkpoints.resume not in ("auto", "none") and not self.checkpoints.resume:
            raise RecipeError("resume must be `auto`, `none` or a checkpoint path")
        # Fails early when the batch cannot be split into whole micro-batches on one process.
        self.grad_accum_steps(1)


def grad_accum_steps(train: TrainConfig, world_size: int, *, seq_len: int) -> int:
    """Micro-batches per optimizer step on each of `world_size` processes, for samples of `seq_len` tokens."""
    per_pass = train.micro_batch_size * seq_len * world_size
    if train.global_batch_tokens % per_pass:
        raise RecipeError(
            f"global_batch_tokens={train.global_batch_tokens} is not a multiple of "
            f"micro_batch_size * seq_len * processes = {train.micro_batch_size} * "
            f"{seq_len} * {world_size} = {per_pass}; change global_batch_tokens "
            f"or micro_batch_size"
        )
    return train.global_batch_tokens // per_pass


def _check_places(t: TrainConfig, d: DataConfig, *, name: str) -> None:
    """An empty output_dir or data_dir is the working directory: an engine's task whose `RUN_URL=` was left
    empty trained there, exited 0 and reached no store (a preemption lost it all). Refused by name, the
    examples named after the recipe (`name`)."""
    for flag, value, example in (
        ("output_dir", t.output_dir, f"runs/{name}"),
        ("data_dir", d.data_dir, f"data/{name}"),
    ):
        if not str(value).strip():
            raise RecipeError(
                f"{flag} is empty (an unset variable in the command line?): give a folder or a store URL, "
                f"e.g. --{flag} {example} or --{flag} s3://BUCKET/{example}"
            )


def _check_model(m: ModelConfig) -> None:
    if m.hidden_size % m.num_attention_heads:
        raise RecipeError(
            f"hidden_size={m.hidden_size} must be divisible by num_attention_heads={m.num_attention_heads}"
        )
    if m.num_attention_heads % m.num_key_value_heads:
        raise RecipeError(
            f"num_attention_heads={m.num_attention_heads} must be divisible by num_key_value_heads={m.num_key_value_heads}"
        )


def _check_data(d: DataConfig, m: ModelConfig) -> None:
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


def _check_compute(c: ComputeConfig, m: ModelConfig) -> None:
    if c.checkpointed_layers > m.num_hidden_layers:
        raise RecipeError(
            f"checkpointed_layers={c.checkpointed_layers} exceeds num_hidden_layers={m.num_hidden_layers}: "
            f"set --checkpointed_layers {m.num_hidden_layers} (all) or fewer"
        )
    if c.compile_regions and not c.compile:
        raise RecipeError("compile_regions=true needs compile=true (it says how to compile, not whether)")
    if c.mixed_precision in SCALED_MATMUL_CHOICES:  # torch._scaled_mm: operand dimensions in multiples of 16
        kv_width = m.num_key_value_heads * (m.hidden_size // m.num_attention_heads)
        widths = {"hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size, "key/value width": kv_width}
        odd = [f"{name}={value}" for name, value in widths.items() if value % SCALED_MATMUL_MULTIPLE]
        if odd:
            raise RecipeError(
                f"mixed_precision={c.mixed_precision} needs the decoder's widths to be multiples of "
                f"{SCALED_MATMUL_MULTIPLE} (torch._scaled_mm); "
                f"{', '.join(odd)} is not: change it, or --mixed_precision bf16"
            )
    if c.chunked_loss and c.liger:
        raise RecipeError(
            "chunked_loss=true with liger=true: Liger's fused loss already keeps the logits out of memory; "
            "set --chunked_loss false (or --liger false)"
        )


def _check_side_work(stopping: StoppingConfig, publish: PublishConfig, reporting: ReportingConfig) -> None:
    """What a run does beside training: price-based stopping, publishing, phases, trackers."""
    if stopping.early_stop_cost_per_loss_point and not reporting.price_per_hour:
        raise RecipeError("early_stop_cost_per_loss_point needs price_per_hour: without a price there is no cost")
    if publish.push_checkpoints and not publish.push_to_hub:
        raise RecipeError("push_checkpoints needs push_to_hub: the repo id to push to")
    for phase, end in reporting.phases.items():  # past max_steps is fine: a shortened run drops them
        if end <= 0:
            raise RecipeError(f"phases.{phase}={end} must be a step, 1 or more")
    check_trackers(reporting.report_to)


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
SECTIONS: dict[str, type] = {
    f.name: f.type if isinstance(f.type, type) else globals()[f.type]
    for f in dataclasses.fields(Recipe)
    if f.name not in ("name", "description")
}
TOP_LEVEL_KEYS = [f.name for f in dataclasses.fields(Recipe) if f.name not in SECTIONS]


def _section_of_key() -> dict[str, str]:
    owner: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in owner and f.name not in SECTIONS, f"key {f.name} is defined twice"
            owner[f.name] = section
    return owner


KEY_SECTION = _section_of_key()

# Keys renamed since an earlier version: the old name still reads, in a recipe, a run's
# resolved_recipe.yaml and on the command line, as the new one; `--help` lists the new one only.
RENAMED_KEYS = {
    "benchmark_tasks": "lm_eval_tasks",
    "benchmark_limit": "lm_eval_limit",
    "benchmark_data_dir": "lm_eval_data_dir",
}


def renamed(values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` (a section's mapping, or flat overrides) with each old key name read as its new one."""
    if not any(name in RENAMED_KEYS for name in values):
        return values
    out: dict[str, Any] = {}
    for name, value in values.items():
        new = RENAMED_KEYS.get(name, name)
        if new in out or (new != name and new in values):
            raise RecipeError(f"`{name}` and `{new}` are the same key (renamed) in {where}; keep `{new}`")
        out[new] = value
    return out


def legacy_layout(raw: dict[str, Any]) -> dict[str, Any]:
    """A recipe mapping as written before the sections (a shipped recipe of an earlier version, a run's
    `resolved_recipe.yaml`), in today's layout: a renamed key under its new name (`RENAMED_KEYS`), and a
    key under `train:` that another section now owns moved there. A key given in both places is refused,
    naming both."""
    raw = {name: renamed(v, name) if isinstance(v, dict) else v for name, v in raw.items()}
    old_train = raw.get("train")
    if not isinstance(old_train, dict) or all(KEY_SECTION.get(k) in ("train", None) for k in old_train):
        return raw
    out = {**raw, "train": {}}
    for name, value in old_train.items():
        section = KEY_SECTION.get(name, "train")  # an unknown key stays under train, to be refused by name
        target = out[section] = dict(out.get(section) or {})
        if section != "train" and name in target:
            raise RecipeError(
                f"`{name}` is given under both `train:` and `{section}:`; keep the one under `{section}:`"
            )
        target[name] = value
    return out
