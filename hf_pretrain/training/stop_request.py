"""`hf-pretrain stop RUN_DIR [--cooldown_steps N]`: ask a running job to finish now, with a finished model.

    hf-pretrain stop runs/1b                       # wsd: decay over decay_fraction x the steps done, then final/
    hf-pretrain stop runs/1b --cooldown_steps 500  # decay over 500 steps
    hf-pretrain stop runs/1b --cooldown_steps 0    # no decay: save and write final/ at the next step

The request is a file in the run folder (`RunDir.stop_request`). The main process of the job reads
it at every step and the guards share it with every other process in the step's one exchange
(training/guards.py), so all of them begin the same cooldown at the same step, however many there
are and on however many machines. A wsd run then decays from the rate it had, saves, and writes
final/; a cosine run stops at once unless a cooldown is asked for, and its log and model card say
that it did not finish its decay. The file goes when the run has finished.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hf_pretrain.config import CommandParser
from hf_pretrain.run_dir import RunDir


@dataclass(frozen=True)
class StopRequest:
    cooldown_steps: int | None  # None: the recipe's default (decay_fraction x the steps done; 0 for a cosine)


def request_stop(run_dir: str | Path, cooldown_steps: int | None = None) -> Path:
    """Write the request, whole or not at all (a job reading it meanwhile never sees half of it)."""
    path = RunDir(run_dir).stop_request
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"cooldown_steps": cooldown_steps, "requested_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
    os.replace(tmp, path)
    return path


def read_stop_request(run_dir: str | Path) -> StopRequest | None:
    """The pending request, if any. A file that cannot be read still asks to stop, with the default
    cooldown: whoever wrote it wanted the run to finish."""
    path = RunDir(run_dir).stop_request
    if not path.is_file():
        return None
    try:
        steps = json.loads(path.read_text()).get("cooldown_steps")
        return StopRequest(int(steps) if steps is not None and int(steps) >= 0 else None)
    except (OSError, ValueError, TypeError, AttributeError):
        return StopRequest(None)


def clear_stop_request(run_dir: str | Path) -> None:
    RunDir(run_dir).stop_request.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="hf-pretrain stop", description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1]
    )
    parser.add_argument("run_dir", type=Path, help="the running job's output_dir")
    parser.add_argument(
        "--cooldown_steps",
        type=int,
        help="steps of learning-rate decay before the run stops (unset: decay_fraction x the steps "
        "done for a wsd run, 0 for a cosine)",
    )
    args = parser.parse_args(argv)
    if args.cooldown_steps is not None and args.cooldown_steps < 0:
        parser.error("--cooldown_steps must be 0 or more")
    run = RunDir(args.run_dir)
    if not run.is_run():
        print(
            f"hf-pretrain stop: error: {run.path} is not a run folder (no checkpoints/, no resolved_recipe.yaml)",
            file=sys.stderr,
        )
        return 2
    path = request_stop(run.path, args.cooldown_steps)
    recipe = run.load_recipe()
    if args.cooldown_steps == 0 or (
        recipe is not None and recipe.train.lr_schedule == "cosine" and args.cooldown_steps is None
    ):
        then = "saves and writes final/ after its next step"
        if recipe is not None and recipe.train.lr_schedule == "cosine":
            then += " (a cosine run: the model will not have finished its decay)"
    else:
        steps = f"{args.cooldown_steps:,} steps" if args.cooldown_steps else "decay_fraction x the steps done"
        then = f"decays its learning rate over {steps} from its next step on, then saves and writes final/"
    print(
        f"asked the run in {run.path} to finish ({path}): it {then}. A run that is not running now reads "
        f"the request when it starts; delete the file to take it back."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
