"""Every command that reads a run reads its URL (issue 40): eval, demo and the doctor, against a local
S3 server (moto, tests/object_store_server.py); a store that cannot be used is one line, exit 78."""

from __future__ import annotations

import json

import pytest

from hf_pretrain.exit_codes import EXIT_CONFIG, EXIT_PREFLIGHT
from tests.helpers import SHORT_RUN
from tests.object_store_server import FAKE_KEY_ID, FAKE_SECRET

# Two ARC-Easy questions in the dataset's own JSONL shape: the local task reads nothing else.
ARC_LINES = [
    {
        "id": "q1",
        "question": "Which is a source of light?",
        "choices": {"text": ["the sun", "a rock", "a shadow", "a hole"], "label": ["A", "B", "C", "D"]},
        "answerKey": "A",
    },
    {
        "id": "q2",
        "question": "What do plants need to grow?",
        "choices": {"text": ["water", "plastic", "noise", "glass"], "label": ["A", "B", "C", "D"]},
        "answerKey": "A",
    },
]


def store_fs():
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)


@pytest.fixture
def run_url(reference_run, s3_bucket, tmp_path, monkeypatch) -> str:
    """The reference run's newest checkpoint and records, uploaded as a run URL; the cache under tmp_path."""
    monkeypatch.setenv("HF_PRETRAIN_HOME", str(tmp_path / "home"))
    url, fs = f"{s3_bucket}/run", store_fs()
    newest = max(p.name for p in (reference_run[0] / "checkpoints").iterdir() if p.name[5:].isdigit())
    fs.put(str(reference_run[0] / "checkpoints" / newest), f"{url}/checkpoints/{newest}", recursive=True)
    for name in ("metrics.jsonl", "resolved_recipe.yaml", "status.json"):
        fs.put_file(str(reference_run[0] / name), f"{url}/{name}")
    return url


def one_error_line(err: str, says: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err, err
    assert FAKE_SECRET not in err and FAKE_KEY_ID not in err


@pytest.mark.slow
def test_eval_scores_a_run_url_from_its_pulled_checkpoint(run_url, tmp_path, capsys):
    from hf_pretrain.evaluation import eval_command

    arc = tmp_path / "arc"
    arc.mkdir()
    for split in ("train", "validation", "test"):
        (arc / f"ARC-Easy-{split}.jsonl").write_text("".join(json.dumps(q) + "\n" for q in ARC_LINES))
    out = tmp_path / "results"
    argv = [
        "--model",
        run_url,
        "--tasks",
        "arc_easy_local",
        "--limit",
        "2",
        "--data_dir",
        str(arc),
        "--batch_size",
        "2",
    ]
    assert eval_command.main([*argv, "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["n-samples"]["arc_easy_local"]["effective"] == 2
    view = tmp_path / "home" / "views" / "s3" / run_url.removeprefix("s3://")
    assert (view / "checkpoints" / "step_00000012" / "model.safetensors").is_file()  # through the one door

    capsys.readouterr()
    assert eval_command.main(["--model", "s3://no-such-bucket-eval/run", "--tasks", "none"]) == EXIT_PREFLIGHT
    one_error_line(capsys.readouterr().err, "bucket 'no-such-bucket-eval' does not exist")


@pytest.mark.slow
def test_demo_offers_the_checkpoints_of_a_run_url(run_url, tmp_path, capsys, monkeypatch):
    from hf_pretrain.publish import demo, demo_command

    served = {}
    monkeypatch.setattr(demo, "run", lambda args: served.setdefault("models", args.model) and 0)
    assert demo_command.main(["--model", run_url]) == 0
    (local,) = served["models"]
    assert str(tmp_path / "home") in local  # the read-only view in the user's cache
    choices = demo.model_choices(local, tmp_path / "demo_cache", log=lambda _: None)
    assert [c.name for c in choices] == ["run/step_00000012"]

    capsys.readouterr()
    assert demo_command.main(["--model", "s3://no-such-bucket-demo/run"]) == EXIT_PREFLIGHT
    one_error_line(capsys.readouterr().err, "bucket 'no-such-bucket-demo' does not exist")


def doctor_rows(capsys, *argv) -> tuple[int, dict[str, str]]:
    from hf_pretrain.preflight import doctor

    code = doctor.main(["--recipe", "smoke", *argv])
    out = capsys.readouterr().out
    assert FAKE_SECRET not in out and FAKE_KEY_ID not in out
    rows = {"verdict": out.strip().splitlines()[-1]}
    for line in out.splitlines():
        for name in ("store upload", "store cache", "store", "resume"):
            if line.startswith(name + " "):
                rows.setdefault(name, line)
                break
    return code, rows


def test_the_doctor_checks_a_url_output_dir(run_url, smoke_data, tmp_path, capsys):
    # the recipe the store's run trained with (12 steps): this machine's copy is empty, and the resume row
    # judges the store's newest checkpoint, as training will once it has pulled it
    short = [a for k, v in SHORT_RUN.items() for a in (f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v))]
    code, rows = doctor_rows(capsys, *short, "--data_dir", str(smoke_data), "--output_dir", run_url)
    assert code == 0, rows
    assert "pass" in rows["resume"] and "goes on from step 12" in rows["resume"], rows
    assert "in the store; training pulls it" in rows["resume"] and "ready to train" in rows["verdict"], rows
    assert "pass" in rows["store"] and "may write" in rows["store"] and "step 12" in rows["store"]
    assert "pass" in rows["store upload"] and "measured with 8.4 MB" in rows["store upload"]
    assert "pass" in rows["store cache"] and str(tmp_path / "home") in rows["store cache"]
    assert not store_fs().exists(f"{run_url}/.hf_pretrain_doctor_rate")  # the probe removed, nothing else

    longer = [*short, "--max_steps", "16"]  # a cosine run under another max_steps: refused, as training would
    code, rows = doctor_rows(capsys, *longer, "--data_dir", str(smoke_data), "--output_dir", run_url)
    assert code == EXIT_CONFIG and "FAIL" in rows["resume"] and "max_steps" in rows["resume"], rows
    store_fs().put_file(__file__, f"{run_url}/final/README.md")  # the run has finished: nothing to train
    code, rows = doctor_rows(capsys, *short, "--data_dir", str(smoke_data), "--output_dir", run_url)
    assert "the run finished at step 12" in rows["verdict"], rows

    code, rows = doctor_rows(capsys, "--data_dir", str(smoke_data), "--output_dir", "s3://no-such-bucket-doc/run")
    assert code == EXIT_CONFIG and "FAIL" in rows["store"] and "'no-such-bucket-doc' does not exist" in rows["store"]
    assert "store upload" not in rows
