"""A command's one answer to what runs, where and on which machine, built at its door (issue 58).

A command's door (training's setup, the doctor) builds a `ResolvedRun` once from the recipe, the machine it
is on, where the run and its data live, and the world size, and hands it down. Below the door nothing works
these out again:

- `profile`: the run profile (machine/run_profile.py), complete: `attention_backend: auto` resolved to the
  SDPA kernel a check measured fastest on that card (check_records.py), so the model, the doctor's row and
  the records name the kernel that runs;
- `where`: the run's and the data's places (store/location.py), each a local folder or a store URL with
  its local copy in the cache folder the door read;
- `key` and `workload`: what a measurement of this step is recorded and found under
  (`measurements.Configuration`), and what the performance model prices (`workload.Workload`, the model's
  shape with it), each of the profile's step and the recipe's batch, worked out once.

A card nobody here runs on is a what-if (machine/what_if.py), never a door's answer; outside `machine/`
only this module builds a profile (tests/test_architecture.py): the pod check's parts and the bench's
variants, which run no places of their own, take `complete_profile` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_pretrain.config import ModelConfig, Recipe, StepAsWritten
from hf_pretrain.economics.check_records import resolved_attention_backend
from hf_pretrain.economics.measurements import Configuration, configuration
from hf_pretrain.economics.workload import Workload, run_workload
from hf_pretrain.machine.run_profile import Machine, RunProfile, run_profile
from hf_pretrain.store.location import Where


def complete_profile(
    written: StepAsWritten, machine: Machine, world_size: int = 1, *, model: ModelConfig, seq_len: int
) -> RunProfile:
    """The run profile of the step a recipe writes on `machine`, complete for a door to hand down:
    `attention_backend: auto` resolved here, once, to the kernel a check measured fastest on that GPU for
    this `model` at `seq_len`."""
    attention = resolved_attention_backend(written.compute.attention_backend, model, seq_len, machine.gpu_name)
    return run_profile(written, machine, world_size, attention=attention)


@dataclass(frozen=True)
class ResolvedRun:
    """What runs (the profile: machine and step), where (the run and its data), and what it is measured
    and priced as (key, workload): one answer, built at a command's door."""

    profile: RunProfile
    where: Where
    key: Configuration
    workload: Workload

    @classmethod
    def at_door(cls, recipe: Recipe, machine: Machine, where: Where, world_size: int = 1) -> ResolvedRun:
        """The answer for `recipe` on `machine` (the door's `this_machine()`, asked once) with `world_size`
        processes, its run and data at `where` (the door's `Where.of`)."""
        model, data, batch = recipe.model, recipe.data, recipe.train.global_batch_tokens
        profile = complete_profile(recipe.step_as_written, machine, world_size, model=model, seq_len=data.seq_len)
        return cls(
            profile,
            where,
            configuration(model, data, profile.step, global_batch_tokens=batch),
            run_workload(model, data, profile.step, batch),
        )

    @property
    def world_size(self) -> int:
        return self.profile.step.world_size
