"""The model card (README.md) of an exported model, its loss-curve image, and its evaluation section.

Everything on the card comes from the run folder: the resolved recipe, `metrics.jsonl`,
`samples.jsonl` and the checkpoint's train state. `hf-pretrain eval` later fills the section between
the two `hf-pretrain:eval` markers and the `model-index` metadata (`write_eval_section`).

What a program reads off the card is in its YAML metadata, never parsed back from the prose: how far
the model was trained sits under `hf_pretrain:` (`card_progress`), which the demo Space reads
(`space_template/app.py`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_pretrain.config import DEFAULT_SOURCE_NAME, OptimConfig, Recipe, SourceConfig, TrainConfig
from hf_pretrain.economics.cost import dollars
from hf_pretrain.formatting import human_count, human_duration, table_cell, usd
from hf_pretrain.model.initialisation import base_model_id
from hf_pretrain.model.llama import count_parameters
from hf_pretrain.optim.build import Schedule
from hf_pretrain.plots import plot_loss
from hf_pretrain.run_folder.run_dir import RunDir, read_jsonl

LOSS_CURVE = "loss_curve.png"
# The Evaluation section's benchmark block, which `hf-pretrain eval` fills (see write_eval_section).
EVAL_START, EVAL_END = "<!-- hf-pretrain:eval:start -->", "<!-- hf-pretrain:eval:end -->"
# Milestones of samples.jsonl shown on the card (first, last and evenly spaced between).
MAX_SAMPLE_MILESTONES = 6
TAGS = ["hf-pretrain", "llama", "pretrained", "text-generation"]
# The card's metadata key for what hf-pretrain knows of the model (`card_progress`); the demo Space
# reads it under the same name (space_template/app.py's CARD_METADATA_KEY: it cannot import this).
CARD_METADATA_KEY = "hf_pretrain"

TEMPLATE = """---
{{ card_data }}
---

# {{ model_name }}

A {{ params }}-parameter Llama model {% if base_model %}continued from {{ base_model }} (its weights and tokenizer)
and pretrained further{% else %}pretrained from scratch{% endif %} with hf-pretrain (recipe `{{ recipe_name }}`):
step {{ step }}{% if max_steps %} of {{ max_steps }}{% endif %}, {{ tokens }} tokens{% if base_model %} of the data mixture below{% endif %}.

```python
from transformers import pipeline

generator = pipeline("text-generation", model="{{ load_from }}")
print(generator("The capital of France is", max_new_tokens=32)[0]["generated_text"])
```

This is a base model: it continues text. It has no chat template{% if chat_markers %}; its tokenizer
reserves ChatML's {{ chat_markers }} so that a chat fine-tune needs no new embeddings{% endif %}.
A GGUF file for llama.cpp: `hf-pretrain gguf <this folder>`.

## Architecture

| | |
|---|---|
{% for key, value in architecture %}| {{ key }} | {{ value }} |
{% endfor %}
## Training

| | |
|---|---|
{% for key, value in training %}| {{ key }} | {{ value }} |
{% endfor %}
{% if sources %}Data mixture (each source's weight: its relative share of the training samples):
{% for source in sources %}
- {{ source }}{% endfor %}
{% endif %}
{% if loss_curve %}![Training and validation loss]({{ loss_curve }})
{% endif %}
{% if samples %}## Samples

Greedy completions of the run's fixed prompts, as the model wrote them during training.
{% for step, tokens_at, rows in samples %}
**Step {{ step }}** ({{ tokens_at }} tokens)

| prompt | completion |
|---|---|
{% for prompt, completion in rows %}| {{ prompt }} | {{ completion }} |
{% endfor %}{% endfor %}{% endif %}
## Evaluation

{{ eval_start }}
Not evaluated yet: `hf-pretrain eval --model <this folder>` fills this section and the card's `model-index`.
{{ eval_end }}
"""


@dataclass
class CardOptions:
    """What the run folder cannot tell the card."""

    model_name: str
    license: str = "apache-2.0"
    repo_id: str | None = None  # the Hub repo it goes to: the usage snippet loads from there
    local_path: str | None = None  # where it was written: its name (never the path) for the snippet without a repo
    hardware: str | None = None  # e.g. "1x H100 80GB"
    price_per_hour: float | None = None  # USD for the whole job; default the recipe's price_per_hour


def _last(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return values[-1] if values else None


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def plot_loss_curve(records: list[dict], path: Path) -> bool:
    """Train loss (and validation points) against tokens seen, as a PNG (the report's loss plot);
    False when there is nothing to plot or no matplotlib."""
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        return False
    try:
        plot_loss(path, train, [r for r in records if r.get("kind") == "eval"])
    except ImportError:
        return False
    return True


def _milestones(samples: list[dict]) -> list[tuple[int, str, list[tuple[str, str]]]]:
    steps = sorted({s["step"] for s in samples})
    if len(steps) > MAX_SAMPLE_MILESTONES:
        last = len(steps) - 1
        steps = [steps[round(i * last / (MAX_SAMPLE_MILESTONES - 1))] for i in range(MAX_SAMPLE_MILESTONES)]
    return [
        (
            step,
            f"{next(s['tokens'] for s in samples if s['step'] == step):,}",
            [(table_cell(s["prompt"]), table_cell(s["completion"])) for s in samples if s["step"] == step],
        )
        for step in steps
    ]


def _architecture(model) -> list[tuple[str, Any]]:
    c = model.config
    rope = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", None))
    return [
        ("parameters", f"{count_parameters(model):,}"),
        ("layers", c.num_hidden_layers),
        ("hidden size", c.hidden_size),
        ("feed-forward (SwiGLU)", c.intermediate_size),
        ("attention heads (query / key-value)", f"{c.num_attention_heads} / {c.num_key_value_heads}"),
        ("vocabulary", f"{c.vocab_size:,}"),
        ("context length", f"{c.max_position_embeddings:,}"),
        ("RoPE theta", rope),
        ("tied embeddings", c.tie_word_embeddings),
        ("weights", str(model.dtype).replace("torch.", "")),
    ]


def _how_it_ended(schedule: Schedule, train_state: dict) -> list[tuple[str, Any]]:
    """Rows for a run that stopped early, did not finish its decay, diverged, or went further from a branch."""
    rows: list[tuple[str, Any]] = []
    cooldown, lr = train_state.get("cooldown"), train_state.get("lr")
    if cooldown:
        decay = (
            f"; the learning rate decayed over steps {cooldown['start'] + 1:,}-{cooldown['end']:,}"
            if cooldown["end"] > cooldown["start"]
            else ""
        )
        rows.append(("stopped early", f"at step {cooldown['start']:,}: {table_cell(cooldown['reason'])}{decay}"))
    if lr is not None and schedule.left_decay_unfinished(train_state.get("step", 0), lr):
        rows.append(
            (
                "decay",
                f"**not finished**: the learning rate was {lr:.3g} ({lr / schedule.peak:.0%} of the "
                f"peak) at this step; a finished model ends at {schedule.floor:.3g}",
            )
        )
    if train_state.get("divergence"):  # training/metrics.py: said, not stopped on
        rows.append(("diverged", f"**yes**: {table_cell(train_state['divergence'])}"))
    for branch in train_state.get("lineage", []):
        rows.append(
            (
                "lineage",
                f"a run planned for {branch['from_max_steps']:,} steps, at step {branch['from_step']:,}, "
                f"went further from its checkpoint of step {branch['branch_step']:,} (the last "
                f"before its decay) to max_steps {branch['max_steps']:,}",
            )
        )
    for change in train_state.get("data_changes", []):
        rows.append(
            (
                "data changed",
                f"after step {change['step']:,}: the run went on with other training shards "
                f"({table_cell(change['to_data_dir'])}, same tokenizer) than it had trained on "
                f"({table_cell(change['from_data_dir'])})",
            )
        )
    return rows


def _planned(train: TrainConfig, optim: OptimConfig, seq_len: int, train_state: dict) -> list[tuple[str, Any]]:
    """The rows of what the recipe planned: its batch, context, peak learning rate and schedule, and how the
    run ended against that schedule."""
    schedule = Schedule(optim, max_steps=train.max_steps)
    return [
        ("batch", f"{train.global_batch_tokens:,} tokens/step"),
        ("sequence length", seq_len),
        ("peak learning rate", optim.learning_rate),
        ("schedule", schedule.describe()),
        *_how_it_ended(schedule, train_state),
    ]


def _training(
    train_state: dict, records: list[dict], planned: list[tuple[str, Any]], hardware: str | None, price_per_hour: float
) -> list[tuple[str, Any]]:
    """The card's training table: steps and tokens, the recipe's `planned` rows (none without a recipe), the
    `hardware` (else the train state's), the time and its cost at `price_per_hour` (0: unknown, no row), the
    figures of the records."""
    train = [r for r in records if r.get("kind") == "train"]
    val = [r for r in records if r.get("kind") == "eval"]
    rows: list[tuple[str, Any]] = [
        ("steps", f"{train_state.get('step', 0):,}"),
        ("tokens", f"{train_state.get('tokens_seen', 0):,}"),
        *planned,
    ]
    rows.append(("hardware", hardware or train_state.get("hardware") or "not recorded"))
    seconds = train_state.get("elapsed_seconds")
    if seconds:
        rows.append(("training time", human_duration(seconds)))
        if price_per_hour:
            rows.append(("cost", f"{usd(dollars(seconds / 3600, price_per_hour))} (at ${price_per_hour:g}/h)"))
    for label, value, fmt in [
        ("throughput (median)", _median(train, "tokens_per_s"), "{:,.0f} tokens/s"),
        ("MFU (median)", _median(train, "mfu"), "{:.1%}"),
        (
            "peak GPU memory",
            max((r["peak_memory_gib"] for r in train if r.get("peak_memory_gib")), default=None),
            "{:.1f} GiB",
        ),
        ("final train loss", _last(train, "loss"), "{:.4f}"),
        ("final validation loss", _last(val, "val_loss"), "{:.4f}"),
    ]:
        if value is not None:
            rows.append((label, fmt.format(value)))
    return rows


def card_progress(train_state: dict, *, recipe_name: str | None, max_steps: int | None) -> dict[str, Any]:
    """How far the model was trained, for the card's metadata: the recipe's name, the step (and the
    `max_steps` planned), the tokens seen; the names train_state.json uses. None: not known (no recipe)."""
    progress = {
        "recipe": recipe_name,
        "step": train_state.get("step", 0),
        "max_steps": max_steps,
        "tokens_seen": train_state.get("tokens_seen", 0),
    }
    return {key: value for key, value in progress.items() if value is not None}


def source_label(source: SourceConfig) -> str:
    """A source as the card names it: local files by their source's name and their file names (or glob), never
    the folders they sit in on the machine that trained (the card is published)."""
    if source.kind != "files":
        return f"{source.kind} `{source.name}`"
    files = ", ".join(f"`{Path(p).name}`" for p in source.paths)
    return f"local files `{source.name}` ({files})" if source.name != DEFAULT_SOURCE_NAME else f"local files {files}"


def write_model_card(folder: Path, train_state: dict, run_dir: Path | None, model, options: CardOptions) -> Path:
    """README.md (and the loss curve it shows) for `model`, exported into `folder` from a checkpoint
    with `train_state` that belongs to `run_dir` (None: a checkpoint outside a run folder)."""
    step = train_state.get("step", 0)
    recipe: Recipe | None = None
    records: list[dict] = []
    samples: list[dict] = []
    if run_dir is not None:
        run = RunDir(run_dir)
        recipe = run.load_recipe()
        # only what happened up to this checkpoint: a later one's numbers would misdescribe it
        records = [r for r in read_jsonl(run.metrics) if r.get("step", 0) <= step]
        samples = [s for s in read_jsonl(run.samples) if s.get("step", 0) <= step]
    sources = recipe.data.sources if recipe is not None else []
    planned = [] if recipe is None else _planned(recipe.train, recipe.optim, recipe.data.seq_len, train_state)
    price = options.price_per_hour or (recipe.reporting.price_per_hour if recipe is not None else 0.0)  # 0: unknown
    progress = card_progress(
        train_state,
        recipe_name=recipe.name if recipe is not None else None,
        max_steps=recipe.train.max_steps if recipe is not None else None,
    )
    hub_datasets = [s.name for s in sources if s.kind == "hub"]
    init_from = recipe.model.init_from if recipe is not None else ""
    base_id = base_model_id(init_from)  # the Hub links a continuation to its base by `base_model`
    base_named = f"[`{base_id}`](https://huggingface.co/{base_id})" if base_id else init_from and f"`{init_from}`"
    card_data = ModelCardData(
        license=options.license,
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=TAGS,
        datasets=hub_datasets or None,
        model_name=options.model_name,
        language=recipe.data.language if recipe is not None else None,
        **{CARD_METADATA_KEY: progress},
        base_model=base_id,
    )
    markers = [t for t in (recipe.data.special_tokens if recipe is not None else []) if t.startswith("<|im_")]
    card = ModelCard.from_template(
        card_data,
        template_str=TEMPLATE,
        model_name=options.model_name,
        params=human_count(count_parameters(model)),
        # the folder is what a user pushes: its name relative to where it sits, never this machine's path
        load_from=options.repo_id
        or (options.local_path and f"./{Path(options.local_path).name}")
        or options.model_name,
        chat_markers=" and ".join(f"`{m}`" for m in markers),
        base_model=base_named,
        recipe_name=recipe.name if recipe is not None else "unknown",
        step=f"{step:,}",
        max_steps=f"{recipe.train.max_steps:,}" if recipe is not None else None,
        tokens=f"{train_state.get('tokens_seen', 0):,}",
        architecture=_architecture(model),
        training=_training(train_state, records, planned, options.hardware, price),
        sources=[f"{source_label(s)}, weight {s.weight}" for s in sources],
        loss_curve=LOSS_CURVE if records and plot_loss_curve(records, folder / LOSS_CURVE) else None,
        samples=_milestones(samples),
        eval_start=EVAL_START,
        eval_end=EVAL_END,
    )
    path = folder / "README.md"
    _save(card, path)
    return path


def _save(card: ModelCard, path: Path) -> None:
    card.text = card.text.rstrip("\n") + "\n"  # Jinja drops the template's final newline
    card.save(path)


def _markers(part: str) -> tuple[str, str]:
    return f"<!-- hf-pretrain:{part}:start -->", f"<!-- hf-pretrain:{part}:end -->"


def write_eval_section(folder: Path, part: str, markdown: str, eval_results: list[EvalResult] | None = None) -> bool:
    """Put `markdown` in the card's `part` block of the Evaluation section: `eval` (the benchmark
    table, there from the start) or another name (added after it when missing), and `eval_results`,
    when given, into the model-index. Other blocks stay as they are, so a run of one measurement
    does not erase another's. False (nothing written) for a card `write_model_card` did not write."""
    path = folder / "README.md"
    if not path.is_file():
        return False
    card = ModelCard.load(path)
    if EVAL_END not in card.text:
        return False
    start, end = _markers(part)
    block = f"{start}\n{markdown.strip()}\n{end}"
    head, found_start, rest = card.text.partition(start)
    _, found_end, tail = rest.partition(end)
    if found_start and found_end:
        card.text = f"{head}{block}{tail}"
    else:
        card.text = card.text.replace(EVAL_END, f"{EVAL_END}\n\n{block}", 1)
    if eval_results is not None:
        card.data.eval_results = eval_results or None  # `card.content` renders them as model-index
        card.data.model_name = card.data.model_name or folder.name
    _save(card, path)
    return True
