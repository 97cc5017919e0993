"""Running under an engine (SkyPilot managed jobs, dstack, Slurm): what a scheduler needs from a run.

- `launch_command.py`: `hf-pretrain launch ...`, `accelerate launch ...` that ends with the trainer's
  own exit code (0 done, 75 rerun, 73 another machine holds the run, 78 refused: never rerun) and no
  launcher traceback after a one-line refusal.
- `accelerate_quietly.py`: the launcher process it runs: accelerate's own launch, its errors caught.
- `exit_file.py`: the trainer's side: its pid and its exit code, left in the folder the wrapper names.
- `skypilot/`, `dstack/`, `slurm/`: the task files, shipped in the package (`hf-pretrain task` writes one out).
"""
