"""Recipe parsing: precedence CLI > YAML > defaults, and every bad input named before any work."""

import dataclasses
import json
import re
import subprocess
import sys
import textwrap

import pytest

from hf_pretrain.config import RecipeError, build_recipe, load_recipe, parse_recipe_args
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.helpers import OUTSIDE_CHECKOUT, ROOT, offline_env, run_captured


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_overrides_defaults_and_cli_overrides_yaml(tmp_path):
    path = write(
        tmp_path,
        """
        train:
          max_steps: 7
          warmup_steps: 2
          learning_rate: 3e-4
        data:
          seq_len: 64
    """,
    )
    recipe, _ = parse_recipe_args(["--recipe", str(path)], prog="t", description="")
    assert recipe.train.max_steps == 7
    assert recipe.optim.learning_rate == pytest.approx(3e-4)  # YAML 1.1 reads 3e-4 as a string: coerced
    assert recipe.data.seq_len == 64
    assert recipe.train.seed == 1234  # default
    recipe, _ = parse_recipe_args(
        [
            "--recipe",
            str(path),
            "--max_steps",
            "9",
            "--seed",
            "5",
            "--compile",
            "true",
            "--output_dir",
            "x/y",
            "--resume",
            "none",
        ],
        prog="t",
        description="",
    )
    assert (recipe.train.max_steps, recipe.train.seed, recipe.compute.compile) == (9, 5, True)
    assert (recipe.train.output_dir, recipe.checkpoints.resume) == ("x/y", "none")


def test_recipe_by_name_and_every_required_override():
    recipe = load_recipe(
        "smoke",
        {
            "save_interval": 3,
            "eval_interval": 4,
            "micro_batch_size": 4,
            "global_batch_tokens": 1024,
            "seq_len": 64,
            "learning_rate": 0.01,
        },
    )
    assert recipe.name == "smoke"
    assert recipe.checkpoints.save_interval == 3 and recipe.evaluation.eval_interval == 4
    assert recipe.grad_accum_steps(1) == 4 and recipe.grad_accum_steps(2) == 2 and recipe.grad_accum_steps(4) == 1


def test_unknown_yaml_key_names_it_and_suggests(tmp_path):
    path = write(
        tmp_path,
        """
        train:
          learning_rat: 0.1
    """,
    )
    with pytest.raises(RecipeError, match=r"unknown key `learning_rat`.*did you mean `learning_rate`"):
        load_recipe(str(path))


def test_key_in_the_wrong_section_is_pointed_out(tmp_path):
    path = write(tmp_path, "seq_len: 12\n")
    with pytest.raises(RecipeError, match=r"`seq_len` belongs in the `data:` section"):
        load_recipe(str(path))


def test_a_key_in_a_section_it_does_not_belong_to_names_its_section(tmp_path):
    path = write(tmp_path, "optim:\n  max_steps: 12\n")
    with pytest.raises(RecipeError, match=r"`max_steps` in .*:optim \(it belongs in the `train:` section\)"):
        load_recipe(str(path))


# ---------------------------------------------------------------------- recipes from before the sections
ASSETS = ROOT / "tests" / "assets"


def flat(recipe) -> dict:
    """Every key's value by its flat name: what a recipe means, whichever section holds each key."""
    from hf_pretrain.config import SECTIONS

    return {name: value for section in SECTIONS for name, value in dataclasses.asdict(getattr(recipe, section)).items()}


def test_a_shipped_recipe_of_an_earlier_version_reads_as_the_same_recipe():
    """The 1b as versions before the sections shipped it, every run key under `train:`: the same recipe,
    key for key, with the same fingerprint (a checkpoint's recorded one still matches)."""
    old = load_recipe(str(ASSETS / "recipe_1b_before_sections.yaml"))
    assert "optim:" not in (ASSETS / "recipe_1b_before_sections.yaml").read_text()
    assert flat(old) == flat(load_recipe("1b")) and old.fingerprint() == load_recipe("1b").fingerprint()
    assert old.optim.lr_schedule == "wsd" and old.compute.compile and old.reporting.price_per_hour == 1.79


def test_a_resolved_recipe_written_by_an_earlier_version_loads_with_every_value(tmp_path):
    """A run's resolved_recipe.yaml from before the sections (what a resume or `report` reads)."""
    old = load_recipe(str(ASSETS / "resolved_recipe_before_sections.yaml"))
    assert (old.train.max_steps, old.optim.learning_rate, old.compute.compile) == (12, 0.002, True)
    assert (old.checkpoints.keep_checkpoints, old.store.cache_dir, old.stopping.hang_timeout_s) == (3, "/tmp/cache", 60)
    assert (old.evaluation.lm_eval_tasks, old.publish.push_to_hub) == (["arc_easy"], "me/run")
    assert (old.reporting.phases, old.reporting.report_to) == ({"a": 6}, "tensorboard")
    # written again, it is in today's layout and reads back the same
    from hf_pretrain.config import save_recipe

    save_recipe(old, tmp_path / "again.yaml")
    assert "optim:" in (tmp_path / "again.yaml").read_text() and load_recipe(str(tmp_path / "again.yaml")) == old


def test_a_key_under_both_train_and_its_section_is_refused_naming_both(tmp_path):
    path = write(tmp_path, "train:\n  learning_rate: 0.1\noptim:\n  learning_rate: 0.2\n")
    with pytest.raises(RecipeError, match=r"`learning_rate` is given under both `train:` and `optim:`"):
        load_recipe(str(path))


def test_a_renamed_key_reads_under_its_old_name_everywhere(tmp_path):
    """benchmark_tasks & co. became lm_eval_tasks & co.: a run's resolved_recipe.yaml, a recipe file and a
    command line of an earlier version still mean what they meant; both names at once are refused."""
    old_yaml = write(tmp_path, "evaluation:\n  benchmark_tasks: [arc_easy]\n  benchmark_limit: 7\n")
    assert load_recipe(str(old_yaml)).evaluation.lm_eval_tasks == ["arc_easy"]
    assert load_recipe(str(old_yaml)).evaluation.lm_eval_limit == 7
    for flag in ("--benchmark_tasks", "--benchmark-tasks"):
        recipe = parse_recipe_args([flag, "[piqa]", "--benchmark-limit=3"], prog="t", description="")[0]
        assert (recipe.evaluation.lm_eval_tasks, recipe.evaluation.lm_eval_limit) == (["piqa"], 3)
    assert build_recipe({}, {"benchmark_data_dir": "arc"}).evaluation.lm_eval_data_dir == "arc"
    both = write(tmp_path, "evaluation:\n  benchmark_tasks: [a]\n  lm_eval_tasks: [b]\n")
    with pytest.raises(RecipeError, match=r"`benchmark_tasks` and `lm_eval_tasks` are the same key"):
        load_recipe(str(both))


@pytest.mark.parametrize(
    "argv", [["--benchmark_tasks", "a", "--lm_eval_tasks", "b"], ["--lm-eval-tasks=b", "--benchmark-tasks", "a"]]
)
def test_a_renamed_key_under_both_names_on_the_command_line_is_refused_as_in_a_recipe_file(argv, capsys):
    """Accepted before, the last one winning (issue 45)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe_args(argv, prog="t", description="")
    err = capsys.readouterr().err
    assert exit_info.value.code == EXIT_CONFIG and len(err.strip().splitlines()) == 1
    assert "are the same key (renamed); keep `--lm_eval_tasks`" in err


def test_every_key_reads_from_the_command_line_in_both_spellings():
    """Each of the recipe's keys, whichever section owns it, as `--key_name` and as `--key-name`."""
    from hf_pretrain.config import KEY_SECTION

    recipe = load_recipe("smoke")
    for name in KEY_SECTION:
        value = recipe.value(name)
        value = "elsewhere" if value is None else value  # a path left unset: set one
        plain = [dataclasses.asdict(v) for v in value] if name == "sources" else value
        text = json.dumps(plain) if isinstance(value, (list, dict)) else str(value)
        text = text.lower() if isinstance(value, bool) else text
        for flag in (f"--{name}", f"--{name.replace('_', '-')}"):
            parsed = parse_recipe_args(["--recipe", "smoke", flag, text], prog="t", description="")[0]
            assert parsed.value(name) == value, (flag, text)


def test_unknown_cli_key_names_nearest(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_recipe_args(["--max_step", "3"], prog="t", description="")
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "unknown key `max_step`" in err and "did you mean `max_steps`" in err


def test_unknown_cli_key_message_has_suggestion(capsys):
    with pytest.raises(SystemExit):
        parse_recipe_args(["--lerning_rate", "3"], prog="t", description="")
    err = capsys.readouterr().err
    assert "unknown key `lerning_rate`" in err and "did you mean `learning_rate`" in err


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"max_steps": "ten"}, r"max_steps must be int, got 'ten'"),
        ({"compile": "maybe"}, r"compile must be bool"),
        ({"learning_rate": [1]}, r"learning_rate must be float"),
        ({"prompts": "hello"}, r"prompts must be a list"),
    ],
)
def test_wrong_type_names_the_key(overrides, message):
    with pytest.raises(RecipeError, match=message):
        build_recipe({}, overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"global_batch_tokens": 1000}, r"global_batch_tokens=1000 is not a multiple"),
        ({"seq_len": 4096, "max_position_embeddings": 2048}, r"seq_len=4096 exceeds max_position_embeddings=2048"),
        ({"lr_schedule": "linear"}, r"lr_schedule='linear' is not one of cosine, wsd"),  # (warmup >= max_steps: a note)
        ({"decay_fraction": 1.5}, r"decay_fraction=1.5 must be in \[0, 1\]"),
        ({"num_attention_heads": 3}, r"hidden_size=128 must be divisible by num_attention_heads=3"),
        ({"num_key_value_heads": 3}, r"num_attention_heads=4 must be divisible by num_key_value_heads=3"),
        ({"mixed_precision": "fp4"}, r"mixed_precision='fp4' is not one of"),
        ({"micro_batch_size": 0}, r"micro_batch_size=0 must be >= 1"),
    ],
)
def test_contradictions_fail_early(overrides, message):
    with pytest.raises(RecipeError, match=message):
        build_recipe({}, overrides)


def test_batch_that_does_not_split_across_processes_says_what_to_change():
    recipe = build_recipe({}, {"global_batch_tokens": 3072, "micro_batch_size": 8, "seq_len": 128})
    assert recipe.grad_accum_steps(1) == 3
    with pytest.raises(RecipeError, match=r"micro_batch_size \* seq_len \* processes = 8 \* 128 \* 2"):
        recipe.grad_accum_steps(2)


def test_missing_recipe_suggests_nearest():
    with pytest.raises(RecipeError, match=r"no recipe named `smok`.*did you mean `smoke`"):
        load_recipe("smok")


def test_sources_are_typed(tmp_path):
    path = write(
        tmp_path,
        """
        data:
          sources:
            - kind: files
              paths: ["a.txt"]
              wieght: 2
    """,
    )
    with pytest.raises(RecipeError, match=r"unknown key `wieght`.*did you mean `weight`"):
        load_recipe(str(path))


def test_train_help_lists_every_key_with_default():
    out = subprocess.run(
        [sys.executable, "-m", "hf_pretrain.cli", "train", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for key in (
        "--output_dir",
        "--max_steps",
        "--seed",
        "--resume",
        "--save_interval",
        "--eval_interval",
        "--micro_batch_size",
        "--global_batch_tokens",
        "--seq_len",
        "--learning_rate",
        "--hidden_size",
    ):
        assert key in out
    assert "(default: 1234)" in out


def test_bad_cli_key_exits_nonzero_before_any_work(tmp_path):
    command = [sys.executable, str(ROOT / "hf_pretrain" / "train.py"), "--recipe", "smoke", "--max_stepz", "3"]
    result = run_captured([*command, "--output_dir", str(tmp_path / "run")], tmp_path, offline_env(), timeout=300)
    assert result.returncode == 2
    assert "unknown key `max_stepz`" in result.stderr and "max_steps" in result.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- keys carry their help and their math
def leaf_fields():
    from hf_pretrain.config import SECTIONS, Recipe, SourceConfig

    for cls in (Recipe, *SECTIONS.values(), SourceConfig):
        for f in dataclasses.fields(cls):
            if f.name not in SECTIONS:
                yield cls.__name__, f


@pytest.mark.parametrize("owner, f", list(leaf_fields()), ids=lambda x: getattr(x, "name", x))
def test_every_key_has_help_and_says_whether_it_changes_the_math(owner, f):
    assert f.metadata.get("help"), f"{owner}.{f.name} has no help"
    assert isinstance(f.metadata.get("math"), bool), f"{owner}.{f.name} does not say whether it changes the math"


def test_fingerprint_moves_with_the_math_keys_only():
    base = build_recipe({}).fingerprint()
    for overrides in (
        {"output_dir": "elsewhere"},
        {"log_interval": 3},
        {"eval_interval": 7},
        {"eval_tokens": 1},
        {"prompts": ["hi"]},
        {"sample_max_new_tokens": 5},
        {"save_interval": 9},
        {"name": "renamed"},
        {"report_to": "tensorboard"},
        {"num_workers": 0},
        {"push_to_hub": "me/x", "push_checkpoints": True},
    ):
        assert build_recipe({}, overrides).fingerprint() == base, overrides
    for overrides in (
        {"learning_rate": 2e-3},
        {"max_steps": 200},
        {"seed": 1},
        {"hidden_size": 256},
        {"sources": [{"kind": "files", "paths": ["a.txt"]}]},
    ):
        assert build_recipe({}, overrides).fingerprint() != base, overrides


# ---------------------------------------------------------------------- CLI > YAML > defaults
def test_yaml_values_are_the_flags_defaults_and_the_command_line_wins(tmp_path, capsys):
    path = write(
        tmp_path,
        """
        train:
          max_steps: 40
          warmup_steps: 4
          phases: {a: 10, b: 40}
          lm_eval_tasks: [arc_easy]
    """,
    )
    recipe, _ = parse_recipe_args(
        ["--recipe", str(path), "--warmup_steps", "2", "--phases", "{a: 20}", "--prompts", "one", "two"],
        prog="t",
        description="",
    )
    t = recipe.train
    assert (t.max_steps, recipe.optim.warmup_steps, recipe.optim.learning_rate) == (
        40,
        2,
        1e-3,
    )  # YAML, command line, default
    assert (recipe.reporting.phases, recipe.evaluation.lm_eval_tasks, recipe.evaluation.prompts) == (
        {"a": 20},
        ["arc_easy"],
        ["one", "two"],
    )
    recipe, _ = parse_recipe_args(
        ["--recipe", str(path), "--lm_eval_tasks", "[]", "--prompts", '["x", "y"]'], prog="t", description=""
    )
    assert (recipe.evaluation.lm_eval_tasks, recipe.evaluation.prompts) == ([], ["x", "y"])  # a YAML list still works
    with pytest.raises(SystemExit):
        parse_recipe_args(["--recipe", str(path), "--help"], prog="t", description="")
    out = capsys.readouterr().out
    assert (
        "optimizer steps; valid >= 1 (default: 40)" in out and "(default: 1234)" in out
    )  # the recipe's value, else the default


def test_shipped_recipes_read_the_same_from_the_command_line():
    for name in ("smoke", "1b"):
        assert parse_recipe_args(["--recipe", name], prog="t", description="")[0] == load_recipe(name)


def test_wrong_type_on_the_command_line_exits_before_any_work(capsys):
    # argparse's own type checks are a command line that does not parse (2); a value the recipe refuses, 78
    for argv, code in ((["--max_steps", "ten"], 2), (["--compile", "maybe"], 2), (["--phases", "{a: x}"], EXIT_CONFIG)):
        with pytest.raises(SystemExit) as exit_info:
            parse_recipe_args(argv, prog="t", description="")
        assert exit_info.value.code == code
    assert "phases.a must be int" in capsys.readouterr().err


# Every command's numeric flags: finite, in range, refused at parse time in one line (issue 45: `check
# --budget_s nan` ran, then a ZeroDivisionError traceback). (command, flags it needs, flag, bad value)
BAD_NUMBERS = [
    ("check", [], "--budget_s", "nan"),
    ("check", [], "--part_limit_s", "-1"),
    ("check", [], "--steps", "0"),
    ("check", [], "--learning_rate", "inf"),  # a recipe key, through every command that reads a recipe
    ("train", [], "--grad_clip", "nan"),
    ("bench", [], "--memory_gib", "-inf"),
    ("plan", ["--recipe", "1b"], "--tokens", "inf"),
    ("plan", ["--params", "1e9", "--gpu", "H100"], "--mfu", "1.5"),
    ("eval", ["--model", "x/y"], "--limit", "nan"),
    ("eval", ["--model", "x/y"], "--limit", "inf"),  # its range: harness.argument_problem, in its own words
    ("report", ["runs/x"], "--price_per_hour", "-2"),
    ("doctor", [], "--num_processes", "0"),
    ("stop", ["runs/x"], "--cooldown_steps", "-5"),
    ("export", ["--checkpoint", "runs/x", "--out", "e"], "--price_per_hour", "nan"),
]


@pytest.mark.parametrize("command, needed, flag, value", BAD_NUMBERS)
def test_every_numeric_flag_of_every_command_is_finite_and_in_range_or_refused_in_one_line(
    command, needed, flag, value, capsys, tmp_path, monkeypatch
):
    from hf_pretrain import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *needed, f"{flag}={value}"])
    err = capsys.readouterr().err
    assert exit_info.value.code == EXIT_CONFIG and len(err.strip().splitlines()) == 1, err
    assert f"error: {flag[2:]}={value} must be " in err, err
    assert not list(tmp_path.iterdir())  # refused before any work


# ---------------------------------------------------------------------- one convention, both spellings
COMMANDS = ["prepare", "train", "doctor", "export", "eval", "bench", "plan", "report", "demo", "space", "gguf"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_lists_snake_case_flags_only(command, capsys):
    from hf_pretrain import cli

    if command == "demo":
        pytest.importorskip("gradio")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", capsys.readouterr().out))
    assert flags and not [f for f in flags if "-" in f[2:]], flags


class Parsed(Exception):
    """Raised in place of a command's work, carrying what its parser read."""


def parsed_flags(monkeypatch, command: str, argv: list[str]) -> dict:
    """What `hf-pretrain COMMAND ARGV` parses to (every command parses with a CommandParser), without
    running the command."""
    from hf_pretrain import cli
    from hf_pretrain.config import CommandParser

    read = CommandParser.parse_known_args

    def parse_and_stop(self, args=None, namespace=None):
        namespace, unread = read(self, args, namespace)
        raise Parsed(vars(namespace), unread)

    monkeypatch.setattr(CommandParser, "parse_known_args", parse_and_stop)
    with pytest.raises(Parsed) as got:
        cli.main([command, *argv])
    values, unread = got.value.args
    assert not unread, unread
    return values


def snake_spelled(argv: list[str]) -> list[str]:
    return [a.replace("-", "_").replace("__", "--", 1) if a.startswith("--") else a for a in argv]


# command, the kebab-case spelling of some of its flags (recipe keys and its own)
DASHED = [
    ("prepare", ["--recipe", "smoke", "--data-dir", "d", "--dry-run", "--tokenizer-train-documents", "300"]),
    ("train", ["--max-steps", "7", "--output-dir=o", "--push-to-hub", "me/m", "--micro-batch-size", "2"]),
    ("stop", ["run", "--cooldown-steps", "5"]),
    ("doctor", ["--num-processes", "2", "--global-batch-tokens", "2048"]),
    (
        "export",
        ["--checkpoint", "c", "--out", "o", "--push-to-hub", "me/m", "--price-per-hour=2", "--gguf-type", "q8_0"],
    ),
    ("eval", ["--model", "m", "--include-path", "x", "--data-dir", "d", "--batch-size", "4", "--num-fewshot", "1"]),
    ("bench", ["--recipe", "smoke", "--gpu-price", "H100=2", "--memory-gib", "3", "--no-search", "--max-steps", "4"]),
    ("plan", ["--params", "1e9", "--tokens-per-s", "1e4", "--price-per-gpu-hour", "2", "--max-gpus", "1"]),
    ("plan", ["--recipe", "smoke", "--max-gpus", "1", "--tokens-per-s", "1e4", "--max-steps", "9"]),
    ("report", ["run", "--price-per-hour", "2"]),
    ("demo", ["--model", "m", "--cache-dir", "c"]),
    ("gguf", ["folder", "--gguf-type", "q8_0"]),
]


@pytest.mark.parametrize("command, dashed", DASHED, ids=[f"{c}-{i}" for i, (c, _) in enumerate(DASHED)])
def test_every_command_reads_kebab_case_flags_as_their_snake_case_twins(command, dashed, monkeypatch):
    # HfArgumentParser, and so every Hugging Face tool, reads `--push-to-hub` as `--push_to_hub`.
    if command == "demo":
        pytest.importorskip("gradio")
    snake = parsed_flags(monkeypatch, command, snake_spelled(dashed))
    assert parsed_flags(monkeypatch, command, dashed) == snake
    assert [k for k, v in snake.items() if v is None] != list(snake)  # the flags did reach their keys


# command, the arguments it needs, an unknown flag in kebab case, the key it is nearest to
UNKNOWN = [
    ("prepare", ["--recipe", "smoke"], "--data-dri", "data_dir"),
    ("train", [], "--max-stepz", "max_steps"),
    ("stop", ["run"], "--cooldown-stepz", "cooldown_steps"),
    ("doctor", [], "--num-proceses", "num_processes"),
    ("export", ["--checkpoint", "c", "--out", "o"], "--push-to-hubb", "push_to_hub"),
    ("eval", ["--model", "m"], "--include-paths", "include_path"),
    ("bench", ["--recipe", "smoke"], "--gpu-prices", "gpu_price"),
    ("plan", ["--params", "1e9"], "--max-gpu", "max_gpus"),
    ("report", ["run"], "--price-per-hours", "price_per_hour"),
    ("demo", ["--model", "m"], "--cache-dirs", "cache_dir"),
    ("space", ["--model", "m", "--out", "o"], "--push-to", "push"),
    ("gguf", ["folder"], "--gguf-types", "gguf_type"),
]


@pytest.mark.parametrize("command, needed, unknown, nearest", UNKNOWN)
def test_an_unknown_kebab_case_flag_is_refused_by_name_with_the_nearest_key(command, needed, unknown, nearest, capsys):
    from hf_pretrain import cli

    if command == "demo":
        pytest.importorskip("gradio")
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, *needed, unknown, "1"])
    assert exit_info.value.code == 2
    assert f"unknown key `{unknown[2:]}` (did you mean `{nearest}`" in capsys.readouterr().err


def test_python_m_train_reads_kebab_case_flags(tmp_path):
    # The launcher's path (`accelerate launch -m hf_pretrain.train ...`, here without the launcher): a range
    # refusal of the dashed key's value proves it was read, and nothing trains.
    command = [sys.executable, "-m", "hf_pretrain.train", "--recipe", "smoke", "--max-steps", "0"]
    run = run_captured([*command, "--output-dir", str(tmp_path)], OUTSIDE_CHECKOUT, offline_env(), timeout=300)
    assert run.returncode == EXIT_CONFIG and "max_steps=0 must be >= 1" in run.stderr, run.stderr
    assert not any(tmp_path.iterdir())


def test_plan_price_is_price_per_gpu_hour_and_the_old_flags_are_refused_naming_it(capsys):
    from hf_pretrain.economics.planning import plan_command

    new = ["--params", "1e9", "--tokens_per_s", "10000", "--price_per_gpu_hour", "2", "--max_gpus", "1", "--json"]
    assert plan_command.main(new) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["price_per_gpu_hour"] == 2 and "note" not in captured.err
    for old, spelled_now in ((["--price", "2"], "price_per_gpu_hour"), (["--max-gpu", "1"], "max_gpus")):
        with pytest.raises(SystemExit) as exit_info:
            plan_command.main(["--params", "1e9", "--tokens_per_s", "10000", *old, "--json"])
        assert exit_info.value.code == 2
        assert f"`{spelled_now}`" in capsys.readouterr().err.split("did you mean")[1]


def test_report_price_is_price_per_hour(tmp_path, capsys):
    from hf_pretrain.run_commands import report

    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path), "--price_per_hour", "-1"])
    assert exit_info.value.code == EXIT_CONFIG
    assert "price_per_hour=-1 must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        report.main([str(tmp_path), "--price", "-1"])
    assert exit_info.value.code == 2
    assert "unknown key `price` (did you mean `price_per_hour`?)" in capsys.readouterr().err


def test_bench_price_is_gpu_price(capsys):
    from hf_pretrain.bench import bench_command as bench

    # A malformed entry reaches the price table (exit 78, naming it); the old spelling is refused naming the new one.
    assert bench.main(["--recipe", "smoke", "--gpu_price", "H100"]) == EXIT_CONFIG
    assert "H100" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--recipe", "smoke", "--price", "H100"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown key `price` (did you mean" in err and "`gpu_price`" in err.split("did you mean")[1]


def test_eval_takes_its_flags_in_both_spellings(capsys, tmp_path):
    from hf_pretrain.evaluation import eval_command

    # folders that exist: eval refuses a missing --data_dir or --include_path in one line first
    x, d = str(tmp_path), str(tmp_path)
    for flags in (
        ["--include_path", x, "--data_dir", d, "--batch_size", "4"],
        ["--include-path", x, "--data-dir", d],
    ):
        with pytest.raises(SystemExit) as exit_info:  # nothing to do: stops after parsing, before loading a model
            eval_command.main(["--model", "m", "--tasks", "none", *flags])
        assert exit_info.value.code == EXIT_CONFIG and "--tasks none needs --text" in capsys.readouterr().err


# ---------------------------------------------------------------------- report_to: any tracker Accelerate knows
def accelerate_tracker_not_installed() -> str:
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    usable = get_available_trackers()
    missing = [t.value for t in LoggerType if t.value != "all" and t not in usable]
    if not missing:
        pytest.skip("every tracker Accelerate supports is installed here")
    return "trackio" if "trackio" in missing else missing[0]


def test_report_to_takes_any_tracker_accelerate_knows_a_list_of_them_or_none():
    from hf_pretrain.config import tracker_names

    assert (
        build_recipe({}, {"report_to": "trackio"}).reporting.report_to == "trackio"
    )  # refused when it was a hand list
    assert tracker_names(build_recipe({}, {"report_to": "tensorboard, mlflow"}).reporting.report_to) == [
        "tensorboard",
        "mlflow",
    ]
    assert tracker_names("none") == [] and tracker_names("all") == ["all"]


@pytest.mark.parametrize("report_to, wrong", [("tensorbord", "tensorboard"), ("tensorboard,nope", None), ("", None)])
def test_a_tracker_accelerate_does_not_know_is_refused_listing_the_known_ones(report_to, wrong, capsys):
    with pytest.raises(RecipeError, match=r"is not a tracker Accelerate knows") as error:
        build_recipe({}, {"report_to": report_to})
    message = str(error.value)
    assert "one or more of all, aim, tensorboard, wandb, trackio" in message and "`none`" in message
    assert (f"did you mean `{wrong}`" in message) == bool(wrong)
    with pytest.raises(SystemExit) as exit_info:  # on the command line: before any work, like any bad key
        parse_recipe_args(["--report_to", report_to], prog="t", description="")
    assert exit_info.value.code == EXIT_CONFIG and "is not a tracker Accelerate knows" in capsys.readouterr().err


def test_the_doctor_passes_two_installed_trackers_and_names_a_missing_one_with_its_install(monkeypatch):
    from accelerate.utils import LoggerType

    from hf_pretrain.preflight import trackers

    missing = accelerate_tracker_not_installed()
    two = build_recipe({}, {"report_to": f"tensorboard,{missing}"})
    result = trackers.check_trackers(two.reporting)
    assert (result.status, result.fix) == ("fail", f"pip install {missing}") and "tensorboard" not in result.reason
    monkeypatch.setattr(trackers, "get_available_trackers", lambda: [LoggerType.TENSORBOARD, LoggerType(missing)])
    assert trackers.check_trackers(two.reporting) == trackers.CheckResult("trackers", "pass", f"tensorboard, {missing}")
    assert trackers.check_trackers(build_recipe({}, {"report_to": "all"}).reporting).reason == f"tensorboard, {missing}"
    assert trackers.check_trackers(build_recipe({}).reporting).status == "skip"


def test_a_tracker_that_is_not_installed_stops_the_run_before_any_work_with_its_install(tmp_path):
    missing = accelerate_tracker_not_installed()
    run = tmp_path / "run"
    command = [sys.executable, str(ROOT / "hf_pretrain" / "train.py"), "--recipe", "smoke"]
    command += ["--report_to", f"tensorboard,{missing}", "--output_dir", str(run), "--data_dir", str(tmp_path / "data")]
    result = run_captured(command, OUTSIDE_CHECKOUT, offline_env(), timeout=300)
    assert result.returncode == 78, result.stderr[-2000:]  # EX_CONFIG: refused, nothing was started
    assert f"trackers: report_to names {missing}, not installed" in result.stderr
    assert f"fix: pip install {missing}" in result.stderr
    assert not (run / "checkpoints").exists() and not (run / "resolved_recipe.yaml").exists()


def test_a_recipe_hands_the_sections_named_and_its_step_as_written():
    recipe = load_recipe("smoke", {"gradient_checkpointing": True, "micro_batch_size": 2})
    assert recipe.sections("model", "train") == {"model": recipe.model, "train": recipe.train}
    with pytest.raises(ValueError, match="no section named trian"):
        recipe.sections("model", "trian")
    written = recipe.step_as_written  # what a run profile reads of it: the layers that recompute are counted
    assert (written.micro_batch_size, written.checkpointed_layers) == (2, recipe.model.num_hidden_layers)
    assert written.compute is recipe.compute and written.optimizer == recipe.optim.optimizer
