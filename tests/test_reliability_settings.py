"""Issue 12, "every setting is checked before money is spent": each numeric key's range, duplicate YAML
keys, and validation over the same tokens whatever the number of processes."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import pytest

from hf_pretrain.config import SECTIONS, RecipeError, SourceConfig, build_recipe, load_recipe, parse_recipe_args
from hf_pretrain.data.loader import validation_batches
from hf_pretrain.exit_codes import EXIT_CONFIG
from tests.helpers import OUTSIDE_CHECKOUT, ROOT, offline_env, run_captured


# ---------------------------------------------------------------------- ranges
@pytest.mark.parametrize(
    "key, value, allowed",
    [
        ("grad_clip", "-1", ">= 0"),  # was gradient ascent: loss 8.4 -> 16.1, rc 0
        ("weight_decay", "-3", ">= 0"),
        ("warmup_steps", "-5", ">= 0"),
        ("sample_max_new_tokens", "-1", ">= 1"),  # was a crash at the first evaluation
        ("adam_beta1", "1.5", "in [0, 1)"),  # passed the doctor, crashed before step 1
        ("adam_beta2", "1", "in [0, 1)"),
        ("learning_rate", "nan", "in (0, 1]"),
        ("seq_len", "0", ">= 1"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_key_and_the_range(key, value, allowed, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_recipe_args(["--recipe", "smoke", f"--{key}", value], prog="hf-pretrain train", description="")
    assert exit_.value.code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{key}=" in err and f"must be {allowed}" in err, err


def test_a_source_key_out_of_range_names_the_source():
    with pytest.raises(RecipeError, match=r"sources\[1\]\.weight=-1.0 must be >= 0"):
        build_recipe({}, {"sources": [{"name": "python-docs"}, {"name": "python-stdlib", "weight": -1}]})


def numeric_keys():
    for cls in (*SECTIONS.values(), SourceConfig):
        for f in dataclasses.fields(cls):
            if f.type in ("int", "float", int, float):
                yield f"{cls.__name__}.{f.name}", f


@pytest.mark.parametrize("f", [f for _, f in numeric_keys()], ids=[name for name, _ in numeric_keys()])
def test_every_numeric_key_declares_its_range(f):
    assert f.metadata.get("range"), f"{f.name} declares no range: key(..., ge=/gt=/le=/lt=)"


def test_a_bad_setting_stops_training_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "hf_pretrain" / "train.py"), "--recipe", "smoke", "--grad_clip", "-1"]
    result = run_captured([*command, "--output_dir", str(run_dir)], OUTSIDE_CHECKOUT, offline_env(), timeout=120)
    assert result.returncode == EXIT_CONFIG
    # refused as the flag is parsed, naming the value as typed (issue 45: every numeric flag, one rule)
    assert "grad_clip=-1 must be >= 0" in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()


# ---------------------------------------------------------------------- duplicate YAML keys
def write(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    path = write(
        tmp_path,
        """
        train:
          max_steps: 10
          warmup_steps: 2
          max_steps: 20
    """,
    )
    with pytest.raises(RecipeError, match=r"r\.yaml, line 4: `max_steps` is given twice \(first on line 2\)"):
        load_recipe(str(path))


def test_a_repeated_section_is_refused_rather_than_dropping_the_first(tmp_path):
    path = write(
        tmp_path,
        """
        train:
          max_steps: 10
        model:
          hidden_size: 64
        train:
          warmup_steps: 3
    """,
    )
    with pytest.raises(RecipeError, match=r"line 5: `train` is given twice \(first on line 1\)"):
        load_recipe(str(path))
    with pytest.raises(SystemExit):  # the command line reads recipes the same way
        parse_recipe_args(["--recipe", str(path)], prog="t", description="")


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    path = write(
        tmp_path,
        """
        data:
          sources:
            - &web {kind: builtin, name: python-docs, weight: 1.0}
            - {<<: *web, weight: 2.0}
    """,
    )
    assert [s.weight for s in load_recipe(str(path)).data.sources] == [1.0, 2.0]


# ---------------------------------------------------------------------- validation tokens
@pytest.mark.parametrize("samples, micro_batch_size", [(16, 8), (37, 8), (5, 8), (100, 3)])
def test_every_world_size_evaluates_the_same_samples_once(samples, micro_batch_size):
    reference = None
    for world_size in (1, 2, 3, 8):
        ranks = [validation_batches(1000, micro_batch_size, world_size, rank, samples) for rank in range(world_size)]
        assert len({len(batches) for batches in ranks}) == 1  # the same number of forwards everywhere (FSDP)
        counted = sorted(i for batches in ranks for indices, n in batches if n for i in indices)
        assert all(n in (0, len(indices)) for batches in ranks for indices, n in batches)
        reference = reference or counted
        assert counted == reference == list(range(samples)), world_size


def test_eval_batches_is_refused_naming_eval_tokens_which_replaced_it(tmp_path, capsys):
    # `eval_batches` (micro-batches per process) read for one release as the tokens it meant; now it is unknown.
    with pytest.raises(RecipeError, match=r"unknown key `eval_batches` \(did you mean `eval_tokens`\?\)"):
        build_recipe({}, {"eval_batches": 3})
    old = write(
        tmp_path,
        """
        train:
          eval_batches: 2
    """,
    )
    with pytest.raises(RecipeError, match=r"unknown key `eval_batches` in .*:train \(did you mean `eval_tokens`\?\)"):
        load_recipe(str(old))
    with pytest.raises(SystemExit) as exit_:
        parse_recipe_args(["--recipe", "smoke", "--eval_batches", "1"], prog="t", description="")
    assert exit_.value.code == 2 and "did you mean `eval_tokens`" in capsys.readouterr().err


def test_the_doctor_says_when_the_validation_split_is_smaller_than_eval_tokens(smoke_data):
    from tests.helpers import prepared_row

    assert prepared_row(load_recipe("smoke", {"data_dir": str(smoke_data)})).status == "pass"
    result = prepared_row(load_recipe("smoke", {"data_dir": str(smoke_data), "eval_tokens": 10**7}))
    assert result.status == "warn" and "eval_tokens=10,000,000 asks for more" in result.reason
