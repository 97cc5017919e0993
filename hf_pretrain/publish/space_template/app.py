"""Compare causal language models on one prompt, side by side, each column streaming its tokens.

This file needs only gradio, torch, transformers and huggingface_hub, on purpose: `hf-pretrain space`
copies it into a Hugging Face Space as its `app.py`, where hf-pretrain is not installed, and
`hf-pretrain demo` serves the same page locally. Run as a script, it reads the models and the example
prompts from `demo.json` beside it; `DEMO_MODELS=repo/a,/path/to/b python app.py` overrides the models.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gradio as gr
import torch
from huggingface_hub import ModelCard, hf_hub_download
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TextIteratorStreamer,
)

MAX_COLUMNS = 3  # wider pages get unreadable; more models are still offered, three at a time
DEFAULT_TITLE = "Compare checkpoints"
UNKNOWN = "unknown"
# Files that may say how far a model was trained, in the order they are trusted: hf-pretrain's
# checkpoint sidecar, then the model card, then the config. Each is read for the keys `step` and
# `tokens_seen`, the names train_state.json uses.
PROGRESS_FILES = ("train_state.json", "README.md", "config.json")
# Where an hf-pretrain model card keeps them: a mapping under this key of its YAML metadata
# (hf_pretrain/publish/model_card.py's CARD_METADATA_KEY, repeated here: this file cannot import it).
CARD_METADATA_KEY = "hf_pretrain"


@dataclass
class ModelChoice:
    """One entry of the model picker."""

    name: str  # shown in the picker, and what API callers pass
    source: str  # what from_pretrained loads: a local model folder or a Hub repo id
    # "step 12 · 24,576 tokens trained" (format_progress); read from the source's files on first use when empty.
    progress: str = ""
    # Makes a loadable folder first and returns it (hf-pretrain demo exports training checkpoints so).
    prepare: Callable[[], str | Path] | None = None


@dataclass
class Settings:
    """The generation controls of the page."""

    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 50  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int = 0


# ---------------------------------------------------------------------------------- training progress
def format_progress(record: dict[str, Any] | None) -> str:
    """`step 12 · 24,576 tokens trained` from a record with `step` and `tokens_seen`; "unknown" where absent."""
    step, tokens = (record or {}).get("step"), (record or {}).get("tokens_seen")
    step_text = f"step {step:,}" if isinstance(step, int) else f"step {UNKNOWN}"
    tokens_text = f"{tokens:,} tokens trained" if isinstance(tokens, int) else f"tokens trained {UNKNOWN}"
    return f"{step_text} · {tokens_text}"


def _local_or_hub_file(source: str, filename: str) -> Path | None:
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder / filename if (folder / filename).is_file() else None
    try:
        return Path(hf_hub_download(source, filename))
    except Exception:  # absent file, unknown repo, offline: progress is decoration, "unknown" will do
        return None


def _card_metadata(path: Path) -> dict[str, Any]:
    """The hf-pretrain mapping of a model card's YAML metadata; {} for a card without one."""
    data = ModelCard.load(path).data.to_dict().get(CARD_METADATA_KEY)
    return data if isinstance(data, dict) else {}


def _metadata(path: Path) -> dict[str, Any]:
    try:
        if path.name == "README.md":
            return _card_metadata(path)
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def read_progress(source: str) -> dict[str, Any] | None:
    """The first of PROGRESS_FILES in `source` that says how far it was trained, as a mapping."""
    for filename in PROGRESS_FILES:
        path = _local_or_hub_file(source, filename)
        data = _metadata(path) if path else {}
        if "step" in data or "tokens_seen" in data:
            return data
    return None


# ---------------------------------------------------------------------------------- models
# Device and dtype are decided here again on purpose: inside hf-pretrain `run_profile.py` is their one
# home, but this file runs in a Space where hf-pretrain is not installed, so it cannot import it.
def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(source: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    device = pick_device()
    dtype = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device).eval()
    return model, tokenizer


class ModelLibrary:
    """The models on offer, loaded on first use; the most recently used few stay in memory."""

    def __init__(self, choices: list[ModelChoice], keep_loaded: int = MAX_COLUMNS):
        self.choices = {choice.name: choice for choice in choices}
        self.keep_loaded = keep_loaded
        self._loaded: OrderedDict[str, tuple[PreTrainedModel, PreTrainedTokenizerBase]] = OrderedDict()

    def names(self) -> list[str]:
        return list(self.choices)

    def progress(self, name: str) -> str:
        choice = self.choices[name]
        if not choice.progress:
            choice.progress = format_progress(read_progress(choice.source))
        return choice.progress

    def get(self, name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        if name in self._loaded:
            self._loaded.move_to_end(name)
            return self._loaded[name]
        choice = self.choices[name]
        source = choice.prepare() if choice.prepare else choice.source
        while len(self._loaded) >= self.keep_loaded:
            self._loaded.popitem(last=False)
        self._loaded[name] = load_model(source)
        return self._loaded[name]


# ---------------------------------------------------------------------------------- generation
def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """End-of-text ids the model's generation config and its tokenizer declare, never hard-coded ones."""
    declared = model.generation_config.eos_token_id
    ids = list(declared) if isinstance(declared, (list, tuple)) else [declared]
    ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(i for i in ids if i is not None))


def generation_kwargs(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, settings: Settings) -> dict[str, Any]:
    stops = stop_token_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else None)
    kwargs: dict[str, Any] = {
        "max_new_tokens": settings.max_new_tokens,
        "eos_token_id": stops or None,
        "pad_token_id": pad,
        "repetition_penalty": settings.repetition_penalty,
        "use_cache": True,
    }  # checkpoints saved for training say use_cache=False
    if settings.temperature > 0:
        kwargs.update(do_sample=True, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    else:
        kwargs.update(do_sample=False)
    return kwargs


def context_length(model: PreTrainedModel) -> int | None:
    """Positions the model was built for (Llama-style `max_position_embeddings`, GPT-2-style `n_positions`)."""
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


def fit_to_context(input_ids: torch.Tensor, context: int | None, max_new_tokens: int) -> tuple[int, int, str]:
    """How many of the prompt's last tokens to keep and how many to generate so that both fit in the
    context, and a notice for the reader when that cut anything ("" when not). Past its context a
    model still writes text, but from positions it never saw: no use without saying so."""
    prompt_tokens = input_ids.shape[1]
    if context is None or prompt_tokens + max_new_tokens <= context:
        return prompt_tokens, max_new_tokens, ""
    keep = min(prompt_tokens, max(1, context - max_new_tokens))
    new = min(max_new_tokens, context - keep)
    notice = (
        f"⚠ the prompt and {max_new_tokens:,} new tokens exceed this model's {context:,}-token context: "
        f"kept the last {keep:,} of the prompt's {prompt_tokens:,} tokens"
    )
    return keep, new, notice + (f", generated {new:,} tokens" if new < max_new_tokens else "")


def stream_completion(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str, settings: Settings
) -> Iterator[str]:
    """The completion so far after every new piece of text; the last value decodes all new tokens at once.
    A prompt too long for the model's context keeps its last tokens, and every value then starts with a
    line that says so (`fit_to_context`): API callers see it as the page does."""
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    keep, max_new_tokens, notice = fit_to_context(inputs.input_ids, context_length(model), settings.max_new_tokens)
    input_ids, attention_mask = inputs.input_ids[:, -keep:], inputs.attention_mask[:, -keep:]
    settings = replace(settings, max_new_tokens=max_new_tokens)
    head = notice + "\n\n" if notice else ""
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            with torch.inference_mode():
                result["ids"] = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    streamer=streamer,
                    **generation_kwargs(model, tokenizer, settings),
                )
        except Exception as exc:  # handed to the page below; end() unblocks the reader
            result["error"] = exc
            streamer.end()

    torch.manual_seed(settings.seed)  # seeds CPU and every GPU; the worker thread draws from them
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    text = head
    for piece in streamer:
        text += piece
        yield text
    worker.join()
    if "error" in result:
        raise result["error"]
    yield head + tokenizer.decode(result["ids"][0, input_ids.shape[1] :], skip_special_tokens=True)


def bad_input(message: str) -> gr.Error:
    """An error the page shows as a message; the server's log gets no traceback for a user's typo."""
    return gr.Error(message, print_exception=False)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def compare(
    library: ModelLibrary, prompt: str, names: list[str], settings: Settings, columns: int
) -> Iterator[list[str]]:
    """The texts of all `columns` after every streamed piece, one model after the other.

    Models run one at a time, each after seeding, so a column's text depends only on its model, the
    prompt and the settings, never on which other models share the page.
    """
    if not prompt or not prompt.strip():
        raise bad_input("Type a prompt first.")
    if not names:
        raise bad_input("Pick at least one model.")
    unknown = [name for name in names if name not in library.choices]
    if unknown:
        raise bad_input(f"Unknown model {unknown[0]!r}; the choices are: {', '.join(library.names())}.")
    if len(names) > columns:
        raise bad_input(f"At most {columns} models side by side; {len(names)} were picked.")
    texts = [""] * columns
    for column, name in enumerate(names):
        try:
            model, tokenizer = library.get(name)
        except Exception as exc:  # a missing repo, a broken folder: say so in its column, run the others
            texts[column] = f"⚠ could not load {name}: {_first_line(exc)}"
            gr.Warning(texts[column])
            yield texts
            continue
        try:
            for text in stream_completion(model, tokenizer, prompt, settings):
                texts[column] = text
                yield texts
        except Exception as exc:  # e.g. a prompt longer than the model's context
            texts[column] = f"⚠ generation failed for {name}: {_first_line(exc)}"
            gr.Warning(texts[column])
            yield texts


# ---------------------------------------------------------------------------------- the page
def default_selection(names: list[str], columns: int) -> list[str]:
    """Evenly spaced picks from first to last: an early, a middle and the latest checkpoint of a run."""
    if len(names) <= columns:
        return list(names)
    if columns == 1:
        return [names[-1]]
    return [names[round(i * (len(names) - 1) / (columns - 1))] for i in range(columns)]


def column_header(library: ModelLibrary, name: str | None) -> str:
    """A column's title: the model's name and how far it was trained; empty for a column with no model."""
    return f"**{name}**  \n{library.progress(name)}" if name else ""


def generation_controls() -> list[Any]:
    """The controls of `Settings`, in one row, in its field order, starting at its defaults."""
    with gr.Row():
        return [
            gr.Slider(1, 512, value=Settings.max_new_tokens, step=1, label="Max new tokens"),
            gr.Slider(0, 2, value=Settings.temperature, step=0.05, label="Temperature (0 = greedy)"),
            gr.Slider(0, 200, value=Settings.top_k, step=1, label="Top-k (0 = off)"),
            gr.Slider(0.05, 1, value=Settings.top_p, step=0.05, label="Top-p"),
            gr.Slider(1, 2, value=Settings.repetition_penalty, step=0.05, label="Repetition penalty"),
            gr.Number(value=Settings.seed, precision=0, label="Seed"),
        ]


def completion_columns(
    library: ModelLibrary, selected: list[str], columns: int
) -> tuple[list[gr.Column], list[gr.Markdown], list[gr.Textbox]]:
    """One column per model side by side, each a header over its completion; those without a pick hidden."""
    panels, headers, outputs = [], [], []
    with gr.Row():
        for column in range(columns):
            name = selected[column] if column < len(selected) else None
            with gr.Column(visible=name is not None) as panel:
                headers.append(gr.Markdown(column_header(library, name)))
                outputs.append(
                    gr.Textbox(
                        label="Completion",
                        lines=8,
                        interactive=False,
                        buttons=["copy"],
                        elem_id=f"completion-{column}",
                    )
                )
            panels.append(panel)
    return panels, headers, outputs


def build_demo(library: ModelLibrary, prompts: list[str], title: str = DEFAULT_TITLE) -> gr.Blocks:
    names = library.names()
    columns = min(len(names), MAX_COLUMNS)
    selected = default_selection(names, columns)

    with gr.Blocks(title=title) as demo:
        gr.Markdown(f"# {title}\nThe same prompt through each picked model; temperature 0 is greedy decoding.")
        with gr.Row():
            prompt = gr.Textbox(
                label="Prompt", lines=2, scale=4, placeholder="The capital of France is", elem_id="prompt"
            )
            button = gr.Button("Generate", variant="primary", scale=1, elem_id="generate")
        if prompts:
            gr.Examples([[p] for p in prompts], inputs=[prompt], label="Milestone prompts")
        models = gr.Dropdown(
            names,
            value=selected,
            multiselect=True,
            max_choices=columns,
            label=f"Models (up to {columns}, in column order)",
        )
        controls = generation_controls()
        panels, headers, outputs = completion_columns(library, selected, columns)

        def generate(
            prompt: str,
            models: list[str],
            max_new_tokens: float,
            temperature: float,
            top_k: float,
            top_p: float,
            repetition_penalty: float,
            seed: float,
        ) -> Iterator[Any]:
            settings = Settings(
                int(max_new_tokens),
                float(temperature),
                int(top_k),
                float(top_p),
                float(repetition_penalty),
                int(seed or 0),
            )
            for texts in compare(library, prompt, list(models or []), settings, columns):
                yield texts[0] if columns == 1 else list(texts)  # one output takes a bare value

        def show_columns(models: list[str]) -> list[Any]:
            models = list(models or [])
            picked = [models[c] if c < len(models) else None for c in range(columns)]
            return (
                [gr.Column(visible=name is not None) for name in picked]
                + [column_header(library, name) for name in picked]
                + [""] * columns
            )  # texts of the previous picks would now sit under the wrong header

        inputs = [prompt, models, *controls]
        # One event for the button and Enter, so gradio's default of one run at a time covers both:
        # the loaded models and torch's global RNG are shared by every visitor.
        gr.on([button.click, prompt.submit], generate, inputs, outputs, api_name="generate")
        models.change(show_columns, models, panels + headers + outputs, api_visibility="private")
    return demo


def main() -> None:
    """A Space's entry point: the models and prompts `hf-pretrain space` wrote into demo.json."""
    config_path = Path(__file__).with_name("demo.json")
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    sources = [s.strip() for s in os.environ.get("DEMO_MODELS", "").split(",") if s.strip()] or config.get("models", [])
    if not sources:
        raise SystemExit("no models: list them in demo.json or DEMO_MODELS")
    library = ModelLibrary([ModelChoice(name=source, source=source) for source in sources])
    # launch() reads GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, which a Space sets
    build_demo(library, config.get("prompts", []), config.get("title", DEFAULT_TITLE)).launch()


if __name__ == "__main__":
    main()
