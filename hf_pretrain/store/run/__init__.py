"""Runs that no machine owns: `output_dir` as an object-store URL.

The run's working copy kept in step with its URL (`run_sync.py`, `uploader.py`, `pull.py`,
`transfer.py`), the one-writer lease (`lease.py`), what a run URL says to the commands that read it
(`reading.py`, `standing.py`, `run_record.py`). It reads checkpoints (`checkpoints/`) and talks to
stores through `store/`; neither of those imports it.
"""
