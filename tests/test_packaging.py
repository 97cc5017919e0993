"""The package as a user installs it: a real wheel, in a fresh venv, used from a folder that is not the repo.

The recipes, prices, lm-eval suites and tasks and the Space template live inside `hf_pretrain/`
(the top-level `recipes/` and `eval/` are links), so a wheel carries them. This test builds that
wheel from a copy of the sources, installs it without its dependencies into a new venv that sees
the test venv's installed packages through a `.pth` file (nothing is downloaded; it takes seconds),
and runs prepare, `accelerate launch -m hf_pretrain.train` and eval from an unrelated folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, SHORT_RUN

# What a wheel must carry besides the Python modules.
DATA_FILES = [
    "hf_pretrain/recipes/smoke.yaml",
    "hf_pretrain/recipes/1b.yaml",
    "hf_pretrain/recipes/134m.yaml",
    "hf_pretrain/recipes/tinyllama-1.1b.yaml",
    "hf_pretrain/machine/gpus.yaml",
    "hf_pretrain/economics/egress.yaml",
    "hf_pretrain/economics/measured.jsonl",
    "hf_pretrain/evaluation/assets/suites/default.yaml",
    "hf_pretrain/evaluation/assets/tasks/arc_easy_local.yaml",
    "hf_pretrain/evaluation/assets/tasks/arc_challenge_local.yaml",
    "hf_pretrain/evaluation/assets/metrics/bits_per_byte/bits_per_byte.py",
    "hf_pretrain/evaluation/assets/reference_scores.yaml",
    "hf_pretrain/publish/space_template/app.py",
    "hf_pretrain/engines/skypilot/1b.yaml",
    "hf_pretrain/engines/skypilot/1b_multinode.yaml",
    "hf_pretrain/engines/dstack/1b.dstack.yml",
    "hf_pretrain/engines/slurm/1b.sbatch",
]
# A few steps of the smoke model: enough to write a checkpoint and final/ in seconds.
TINY_RUN = {
    **SHORT_RUN,
    "max_steps": 3,
    "warmup_steps": 1,
    "save_interval": 3,
    "eval_interval": 3,
    "phases": {"all": 3},
    "report_to": "none",
}
# Two made-up ARC questions, in the ai2_arc JSONL format the offline tasks read.
ARC_ROWS = [
    {
        "id": "q1",
        "question": "Which of these is a colour?",
        "choices": {"text": ["blue", "seven", "quickly", "under"], "label": ["A", "B", "C", "D"]},
        "answerKey": "A",
    },
    {
        "id": "q2",
        "question": "What does a plant need to grow?",
        "choices": {"text": ["a radio", "light", "a coin", "glass"], "label": ["A", "B", "C", "D"]},
        "answerKey": "B",
    },
]


def copy_sources(into: Path) -> Path:
    """The files a build reads (never the repo itself: an in-tree build would leave build/ and a
    stale build/lib behind, whose deleted modules end up in the next wheel)."""
    into.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, into / name)
    shutil.copytree(ROOT / "hf_pretrain", into / "hf_pretrain", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def fresh_venv(path: Path) -> Path:
    """A venv without pip whose interpreter also sees the test venv's packages, behind its own:
    plain directory lines in a .pth are appended to sys.path, and the .pth files inside them (the
    editable install's finder among them) are not run, so `hf_pretrain` comes only from this venv."""
    venv.create(path, with_pip=False, symlinks=os.name != "nt")
    python = path / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site) / "_test_venv_packages.pth").write_text("\n".join(ours) + "\n")
    return python


def run(cmd: list, cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{log[-4000:]}"
    return log


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel without isolation needs setuptools (the dev extra)")
    tmp = tmp_path_factory.mktemp("wheel")
    sources = copy_sources(tmp / "src")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            tmp / "dist",
            sources,
        ],
        cwd=tmp,
        env=dict(os.environ),
    )
    (built,) = (tmp / "dist").glob("hf_pretrain-*.whl")
    return built


def test_the_wheel_carries_recipes_prices_eval_suites_and_the_space_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in DATA_FILES if name not in names]
    assert not missing, f"the wheel lacks {missing}: add them to [tool.setuptools.package-data]"
    # every file of the source tree, so a data file added later cannot be left out either
    sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "hf_pretrain").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sources <= names, f"files missing from the wheel: {sorted(sources - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "hf-pretrain = hf_pretrain.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_installed_wheel_prepares_trains_and_evaluates_from_another_folder(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv")
    bin_dir = python.parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PATH=str(bin_dir) + os.pathsep + env.get("PATH", ""),
    )
    run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            "--disable-pip-version-check",
            wheel,
        ],
        cwd=tmp_path,
        env=env,
    )
    work = tmp_path / "elsewhere"  # not the repo: nothing can be found through the working directory
    work.mkdir()

    where = json.loads(
        run(
            [
                python,
                "-c",
                (
                    "import json, hf_pretrain, hf_pretrain.config as c, hf_pretrain.evaluation.harness as h\n"
                    "tasks, shots = h.resolve_tasks('default')\n"
                    "print(json.dumps({'package': hf_pretrain.__file__, 'smoke': str(c.resolve_recipe_path('smoke')),\n"
                    "                  'suite': str(h.SUITES_DIR / 'default.yaml'), 'tasks': tasks, 'shots': shots,\n"
                    "                  'local_tasks': sorted(str(p) for p in h.LOCAL_TASKS_DIR.glob('*.yaml'))}))"
                ),
            ],
            cwd=work,
            env=env,
        ).splitlines()[-1]
    )
    installed = (tmp_path / "venv").resolve()
    found = [where["package"], where["smoke"], where["suite"], *where["local_tasks"]]
    assert len(where["local_tasks"]) == 2
    for path in map(Path, found):
        assert path.is_file() and path.resolve().is_relative_to(installed), f"{path} is not inside the new venv"
    assert where["tasks"][:2] == ["arc_easy", "arc_challenge"] and where["shots"] == 0

    data, out = work / "data", work / "run"
    run([bin_dir / "hf-pretrain", "prepare", "--recipe", "smoke", "--data_dir", data], cwd=work, env=env)
    assert (data / "meta.json").is_file() and (data / "tokenizer" / "tokenizer.json").is_file()

    overrides = [
        item
        for key, value in TINY_RUN.items()
        for item in (f"--{key}", json.dumps(value) if isinstance(value, dict) else value)
    ]
    log = run(
        [
            python,
            "-m",
            "accelerate.commands.launch",
            "--cpu",
            "--num_processes",
            1,
            "--num_machines",
            1,
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "-m",
            "hf_pretrain.train",
            "--recipe",
            "smoke",
            "--data_dir",
            data,
            "--output_dir",
            out,
            *overrides,
        ],
        cwd=work,
        env=env,
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3], log[-2000:]
    assert (out / "final" / "model.safetensors").is_file()

    arc = work / "arc"
    arc.mkdir()
    for name in ("Easy", "Challenge"):
        for split in ("train", "validation", "test"):
            (arc / f"ARC-{name}-{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ARC_ROWS))
    run(
        [
            bin_dir / "hf-pretrain",
            "eval",
            "--model",
            out / "final",
            "--tasks",
            "arc_easy_local",
            "--data_dir",
            arc,
            "--limit",
            2,
            "--output",
            work / "scores",
        ],
        cwd=work,
        env=env,
    )
    results = json.loads((work / "scores" / "results.json").read_text())
    assert "acc,none" in results["results"]["arc_easy_local"]
