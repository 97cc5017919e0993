"""The checkpoint room: what a checkpoint is on disk, and everything that reads one.

- `layout.py`: the files a checkpoint holds and the names Accelerate gives them;
- `manifest.py`: the manifest that makes a checkpoint whole or absent (hashing, verifying);
- `store.py`: a run's checkpoints: listing, the newest good one, pins, retention, milestones;
- `load.py`: weights into a model (FSDP shards merged), a whole training state into a run.

Training decides when to save and how processes agree (`checkpoints/checkpointer.py`); publishing,
evaluation and the preflight read checkpoints through this room and never import `training/`.
"""
