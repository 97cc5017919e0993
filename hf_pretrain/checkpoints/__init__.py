"""The checkpoint wing: what a checkpoint is on disk, how one is written, and everything that reads one.

- `layout.py`: the files a checkpoint holds and the names Accelerate gives them;
- `manifest.py`: the manifest that makes a checkpoint whole or absent (writing, verifying);
- `checksum.py`, `tensor_files.py`: every byte checksummed as it is written, in one pass;
- `progress.py`: the live line of a wait over bytes (a save, a verification), status.json's activity;
- `checkpointer.py`: when a run saves; `saving.py`: one save, every process taking part, sealed in
  the background; `async_save.py`: a periodic save staged into host memory; `disk_space.py`: a
  failed write judged by the volume;
- `store.py`: a run's checkpoints: listing, the newest good one, pins, retention, milestones;
- the resume story, three files named alike: `resume_decision.py`, whether and from which checkpoint
  a run resumes (`decide_resume`, every file checked); `resume_rules.py`, what may change since the
  checkpoint (`plan_continuation`, one function per refusal); `resume_plan.py`, the plan a run goes
  on by (`Continuation`, `ResumeRefused`). The doctor's row is preflight/resume.py;
- `load.py`: weights into a model (FSDP shards merged), a whole training state into a run.

Publishing, evaluation, the preflight and the loop use checkpoints through this wing, which imports
none of them (tests/test_architecture.py).
"""
