"""`hf-pretrain demo`: model choices from a run, the page served for real and driven through its API
and through a headless Chromium."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from hf_pretrain.checkpoints.store import resolve_checkpoint  # noqa: E402
from hf_pretrain.config import DEFAULT_PROMPTS, load_recipe, save_recipe  # noqa: E402
from hf_pretrain.exit_codes import EXIT_CONFIG
from hf_pretrain.publish.demo import DemoError, build, cached_export, milestone_prompts, model_choices  # noqa: E402
from hf_pretrain.publish.space_template.app import format_progress, load_model, read_progress  # noqa: E402

PROMPT = "The capital of France is"
MISSING_REPO = "nobody/no-such-model"  # offline, so loading it fails the way a missing repo does
pytestmark = pytest.mark.filterwarnings("ignore:.*:Warning:gradio.queueing")  # gradio's own pandas deprecations
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Flags that keep Chromium headless, sandbox-free (CI runs as root) and off the network.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def greedy_completion(folder: Path, prompt: str, max_new_tokens: int) -> str:
    """What plain `model.generate` produces greedily: the reference the page must match. The model is
    loaded as the page loads it (its device and dtype), so the two agree on a GPU machine too."""
    model, tokenizer = load_model(str(folder))
    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)
    out = model.generate(
        input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, max_new_tokens=max_new_tokens, do_sample=False
    )
    return tokenizer.decode(out[0, inputs.input_ids.shape[1] :], skip_special_tokens=True)


@pytest.fixture(scope="module")
def untrained_model(reference_run, tmp_path_factory) -> Path:
    """The smoke model freshly initialised: its greedy text varies token to token, unlike the 12-step
    model's, so matching it says something."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    final = reference_run[0] / "final"
    folder = tmp_path_factory.mktemp("untrained") / "untrained"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(final)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(final).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(reference_run, untrained_model, tmp_path_factory):
    """The page for the reference run, the untrained model and a missing repo, on 127.0.0.1: (url, client)."""
    from gradio_client import Client

    demo = build(
        [str(reference_run[0]), str(untrained_model), MISSING_REPO],
        cache_dir=tmp_path_factory.mktemp("demo_cache"),
        log=lambda _: None,
    )
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield url, Client(url, verbose=False)
    finally:
        demo.close()


def ask(
    client, models: list[str], prompt: str = PROMPT, max_new_tokens: int = 24, temperature: float = 0.0, seed: int = 0
) -> tuple[str, ...]:
    return client.predict(prompt, models, max_new_tokens, temperature, 50, 1.0, 1.0, seed, api_name="/generate")


# ---------------------------------------------------------------------------------- model choices
@pytest.mark.slow
def test_a_run_offers_its_checkpoints_and_final_model_with_their_progress(reference_run, tmp_path):
    choices = model_choices(str(reference_run[0]), tmp_path)
    assert [c.name for c in choices] == ["run/step_00000008", "run/step_00000012", "run/final"]
    progress = {c.name: c.progress for c in choices}
    tokens_per_step = load_recipe(str(reference_run[0] / "resolved_recipe.yaml")).train.global_batch_tokens
    assert progress["run/step_00000008"] == f"step 8 · {8 * tokens_per_step:,} tokens trained"
    # final/ carries no sidecar: its progress is that of the checkpoint at max_steps it was written from
    assert progress["run/final"] == f"step 12 · {12 * tokens_per_step:,} tokens trained"


@pytest.mark.slow
def test_a_checkpoint_exports_once_and_reloads_with_tied_weights_equal_to_the_final_model(reference_run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    run_dir = reference_run[0]
    checkpoint = resolve_checkpoint(run_dir / "checkpoints" / "step_00000012")
    exported = cached_export(checkpoint, tmp_path)
    written = (exported / "model.safetensors").stat().st_mtime_ns
    assert cached_export(checkpoint, tmp_path) == exported
    assert (exported / "model.safetensors").stat().st_mtime_ns == written  # served from the cache
    assert sorted(p.name for p in tmp_path.iterdir()) == [exported.name]  # no leftovers
    model = AutoModelForCausalLM.from_pretrained(exported)
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    for (name, weight), (final_name, final_weight) in zip(
        model.state_dict().items(), final.state_dict().items(), strict=True
    ):
        assert name == final_name and torch.equal(weight, final_weight), name
    # an export says how far it was trained in its model card, and the page reads it there
    assert format_progress(read_progress(str(exported))) == format_progress(checkpoint.train_state)
    assert format_progress(checkpoint.train_state).startswith("step 12 · ")


def test_the_page_reads_progress_from_the_card_metadata_not_its_prose(tmp_path):
    from huggingface_hub import ModelCard
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_pretrain.publish import model_card
    from hf_pretrain.publish.space_template import app

    assert app.CARD_METADATA_KEY == model_card.CARD_METADATA_KEY  # the app keeps its own copy: it cannot import
    tiny = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
        )
    )
    card = model_card.write_model_card(
        tmp_path, {"step": 7, "tokens_seen": 1234}, None, tiny, model_card.CardOptions("tiny")
    )
    assert ModelCard.load(card).data.to_dict()[model_card.CARD_METADATA_KEY] == {"step": 7, "tokens_seen": 1234}
    assert format_progress(read_progress(str(tmp_path))) == "step 7 · 1,234 tokens trained"
    # the opening sentence says the same to a reader, but nothing parses it back
    card.write_text(card.read_text().replace(f"{model_card.CARD_METADATA_KEY}:", "other:"))
    assert "step 7, 1,234 tokens." in card.read_text()
    assert format_progress(read_progress(str(tmp_path))) == "step unknown · tokens trained unknown"


@pytest.mark.slow
def test_a_model_folder_without_a_card_or_sidecar_has_unknown_progress(untrained_model, tmp_path):
    [choice] = model_choices(str(untrained_model), tmp_path)
    assert (choice.name, choice.source) == (str(untrained_model), str(untrained_model))
    assert format_progress(read_progress(choice.source)) == "step unknown · tokens trained unknown"


def test_example_prompts_come_from_the_runs_recipe_else_the_defaults(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    save_recipe(
        load_recipe("smoke", {"prompts": ["Water boils at", "The first emperor of Rome"]}), run / "resolved_recipe.yaml"
    )
    assert milestone_prompts([str(run), str(run / "checkpoints" / "step_00000004"), "org/model"]) == [
        "Water boils at",
        "The first emperor of Rome",
    ]
    assert milestone_prompts(["org/model"]) == DEFAULT_PROMPTS


def test_a_model_that_names_nothing_is_refused_before_serving(tmp_path, capsys):
    from hf_pretrain.cli import main as cli

    assert cli(["demo", "--model", str(tmp_path / "missing" / "x")]) == EXIT_CONFIG
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(DemoError, match="not a run folder"):
        model_choices(str(tmp_path), tmp_path / "cache")
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(DemoError, match="no complete checkpoint"):
        model_choices(str(tmp_path / "empty_run"), tmp_path / "cache")


# ---------------------------------------------------------------------------------- the API
@pytest.mark.slow
def test_greedy_text_through_the_api_equals_model_generate(served, untrained_model):
    _, client = served
    texts = ask(client, [str(untrained_model)], max_new_tokens=24)
    assert texts[0] == greedy_completion(untrained_model, PROMPT, 24)
    assert texts[0].strip() and texts[1:] == ("", "")


@pytest.mark.slow
def test_two_models_side_by_side_answer_in_their_columns(served, reference_run, untrained_model):
    _, client = served
    final_text, untrained_text, unused = ask(client, ["run/final", str(untrained_model)], max_new_tokens=16)
    assert final_text == greedy_completion(reference_run[0] / "final", PROMPT, 16)
    assert untrained_text == greedy_completion(untrained_model, PROMPT, 16)
    assert unused == ""


@pytest.mark.slow
def test_a_column_streams_its_text_as_it_is_generated(served, untrained_model):
    _, client = served
    # sampled, the untrained model writes many words; the streamer hands text over word by word
    job = client.submit(PROMPT, [str(untrained_model)], 32, 1.0, 0, 1.0, 1.0, 0, api_name="/generate")
    final = job.result()[0]
    updates = [texts[0] for texts in job.outputs()]
    assert len(set(updates)) > 3
    assert all(final.startswith(update) for update in updates)


@pytest.mark.slow
def test_sampling_follows_the_seed(served, untrained_model):
    _, client = served
    first = ask(client, [str(untrained_model)], temperature=1.0, seed=1)[0]
    assert ask(client, [str(untrained_model)], temperature=1.0, seed=1)[0] == first
    assert ask(client, [str(untrained_model)], temperature=1.0, seed=2)[0] != first


@pytest.mark.slow
def test_bad_input_comes_back_as_a_message(served):
    from gradio_client.exceptions import AppError

    _, client = served
    with pytest.raises(AppError, match="Type a prompt first"):
        ask(client, ["run/final"], prompt="   ")
    with pytest.raises(AppError, match="Pick at least one model"):
        ask(client, [])
    texts = ask(client, [MISSING_REPO, "run/step_00000008"], max_new_tokens=4)
    assert texts[0].startswith(f"⚠ could not load {MISSING_REPO}")
    assert texts[1]  # the other column still ran


@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_cut_and_the_api_says_so(served, untrained_model):
    from hf_pretrain.publish.space_template.app import fit_to_context

    _, client = served
    model, tokenizer = load_model(str(untrained_model))
    context = model.config.max_position_embeddings
    prompt = PROMPT + " and" * (2 * context)
    text = ask(client, [str(untrained_model)], prompt=prompt, max_new_tokens=16)[0]
    notice, completion = text.split("\n\n", 1)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert notice.startswith(
        f"⚠ the prompt and 16 new tokens exceed this model's {context}-token context: "
        f"kept the last {context - 16} of the prompt's {ids.shape[1]:,} tokens"
    )
    kept = tokenizer.decode(ids[0, -(context - 16) :])
    assert completion == greedy_completion(untrained_model, kept, 16)  # the prompt's end, in the context
    assert fit_to_context(ids[:, :10], context, 16) == (10, 16, "")  # a prompt that fits is left alone
    assert fit_to_context(ids[:, :10], 8, 16)[:2] == (1, 7)  # more new tokens than the context holds


# ---------------------------------------------------------------------------------- a real browser
def chromium_driver(profile: Path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra has it)")
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip(f"{CHROMIUM} and {CHROMEDRIVER} are needed: apt-get install -y chromium chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    # an explicit driver path keeps Selenium Manager from looking for (or downloading) one
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)


@pytest.mark.slow
def test_a_browser_types_a_prompt_presses_generate_and_sees_text(served, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, _ = served
    driver = chromium_driver(tmp_path / "chromium-profile")
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 60)
        prompt = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea"))
        generate = driver.find_element(By.CSS_SELECTOR, "#generate")
        generate.click()  # nothing typed yet: a message, not a trace
        wait.until(lambda d: "Type a prompt first" in d.find_element(By.TAG_NAME, "body").text)

        prompt.send_keys(PROMPT)
        generate.click()

        def column_text(column: int) -> str:
            return driver.find_element(By.CSS_SELECTOR, f"#completion-{column} textarea").get_attribute("value")

        # the default picks: the first checkpoint, the final model, the missing repo
        wait.until(lambda d: column_text(0) and column_text(2))
        assert not column_text(0).startswith("⚠")
        assert column_text(2).startswith(f"⚠ could not load {MISSING_REPO}")
        assert "step 8 · " in driver.find_element(By.TAG_NAME, "body").text
        screenshot = tmp_path / "demo.png"
        assert driver.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 0
    finally:
        driver.quit()
        shutil.rmtree(tmp_path / "chromium-profile", ignore_errors=True)
