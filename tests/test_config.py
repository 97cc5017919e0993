"""Recipe parsing: precedence CLI > YAML > defaults, and every bad input named before any work."""

import subprocess
import sys
import textwrap

import pytest

from hf_pretrain.config import RecipeError, build_recipe, load_recipe, parse_recipe_args


def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_overrides_defaults_and_cli_overrides_yaml(tmp_path):
    path = write(tmp_path, """
        train:
          max_steps: 7
          warmup_steps: 2
          learning_rate: 3e-4
        data:
          seq_len: 64
    """)
    recipe, _ = parse_recipe_args(["--recipe", str(path)], prog="t", description="")
    assert recipe.train.max_steps == 7
    assert recipe.train.learning_rate == pytest.approx(3e-4)  # YAML 1.1 reads 3e-4 as a string: coerced
    assert recipe.data.seq_len == 64
    assert recipe.train.seed == 1234  # default
    recipe, _ = parse_recipe_args(["--recipe", str(path), "--max_steps", "9", "--seed", "5", "--compile", "true",
                                   "--output_dir", "x/y", "--resume", "none"], prog="t", description="")
    assert (recipe.train.max_steps, recipe.train.seed, recipe.train.compile) == (9, 5, True)
    assert (recipe.train.output_dir, recipe.train.resume) == ("x/y", "none")


def test_recipe_by_name_and_every_required_override():
    recipe = load_recipe("smoke", {"save_interval": 3, "eval_interval": 4, "micro_batch_size": 4,
                                   "global_batch_tokens": 1024, "seq_len": 64, "learning_rate": 0.01})
    assert recipe.name == "smoke"
    assert recipe.train.save_interval == 3 and recipe.train.eval_interval == 4
    assert recipe.grad_accum_steps(1) == 4 and recipe.grad_accum_steps(2) == 2 and recipe.grad_accum_steps(4) == 1


def test_unknown_yaml_key_names_it_and_suggests(tmp_path):
    path = write(tmp_path, """
        train:
          learning_rat: 0.1
    """)
    with pytest.raises(RecipeError, match=r"unknown key `learning_rat`.*did you mean `learning_rate`"):
        load_recipe(str(path))


def test_key_in_the_wrong_section_is_pointed_out(tmp_path):
    path = write(tmp_path, "seq_len: 12\n")
    with pytest.raises(RecipeError, match=r"`seq_len` belongs in the `data:` section"):
        load_recipe(str(path))


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


@pytest.mark.parametrize("overrides, message", [
    ({"max_steps": "ten"}, r"max_steps must be int, got 'ten'"),
    ({"compile": "maybe"}, r"compile must be bool"),
    ({"learning_rate": [1]}, r"learning_rate must be float"),
    ({"prompts": "hello"}, r"prompts must be a list"),
])
def test_wrong_type_names_the_key(overrides, message):
    with pytest.raises(RecipeError, match=message):
        build_recipe({}, overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"global_batch_tokens": 1000}, r"global_batch_tokens=1000 is not a multiple"),
    ({"seq_len": 4096, "max_position_embeddings": 2048}, r"seq_len=4096 exceeds max_position_embeddings=2048"),
    ({"warmup_steps": 100, "max_steps": 50}, r"warmup_steps=100 must be smaller than max_steps=50"),
    ({"num_attention_heads": 3}, r"hidden_size=128 must be divisible by num_attention_heads=3"),
    ({"num_key_value_heads": 3}, r"num_attention_heads=4 must be divisible by num_key_value_heads=3"),
    ({"mixed_precision": "fp8"}, r"mixed_precision='fp8' is not one of"),
    ({"micro_batch_size": 0}, r"micro_batch_size=0 must be positive"),
])
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
    path = write(tmp_path, """
        data:
          sources:
            - kind: files
              paths: ["a.txt"]
              wieght: 2
    """)
    with pytest.raises(RecipeError, match=r"unknown key `wieght`.*did you mean `weight`"):
        load_recipe(str(path))


def test_train_help_lists_every_key_with_default():
    out = subprocess.run([sys.executable, "-m", "hf_pretrain.cli", "train", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for key in ("--output_dir", "--max_steps", "--seed", "--resume", "--save_interval", "--eval_interval",
                "--micro_batch_size", "--global_batch_tokens", "--seq_len", "--learning_rate", "--hidden_size"):
        assert key in out
    assert "(default: 1234)" in out


def test_bad_cli_key_exits_nonzero_before_any_work(tmp_path):
    result = subprocess.run([sys.executable, "hf_pretrain/train.py", "--recipe", "smoke", "--max_stepz", "3",
                             "--output_dir", str(tmp_path / "run")], capture_output=True, text=True)
    assert result.returncode == 2
    assert "unknown key `max_stepz`" in result.stderr and "max_steps" in result.stderr
    assert not (tmp_path / "run").exists()
