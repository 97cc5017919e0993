"""What-ifs: how a recipe would run on a card nobody here is running it on, the one builder of such profiles.

A command's door builds the profile of the machine it is on (economics/resolved_run.complete_profile, from
`this_machine()`), and everything below it reads that one. A question about another card is modelling, not
asking: `plan` and the GPU ranking price the recipe on a named card of the table, the check's verdict on the
card its parts measured, the doctor on a CPU the memory and measurements of a GPU. Each says so by calling
this module, so that a reader sees which card a figure is of, and no function hides a card nobody chose
behind a default.
"""

from __future__ import annotations

from hf_pretrain.config import StepAsWritten
from hf_pretrain.machine.gpus import GPU, find_gpu
from hf_pretrain.machine.run_profile import Machine, RunProfile, machine_with, run_profile


def profile_on(
    written: StepAsWritten,
    on: GPU | str | Machine,
    world_size: int = 1,
    micro_batch_size: int | None = None,
    checkpointed_layers: int | None = None,
) -> RunProfile:
    """How the step a recipe writes (`recipe.step_as_written`) would run on `on`: a card of the GPU table (its
    row, or a name `--gpu` takes), or a `Machine` already built, with `world_size` processes; the micro-batch
    and checkpointed layers are the recipe's unless given (a fit's). The recipe's `attention_backend` as
    written: a what-if has no check's records of its own card to resolve `auto` from."""
    machine = on if isinstance(on, Machine) else machine_with(on)
    return run_profile(written, machine, world_size, micro_batch_size, checkpointed_layers)


def profile_on_any_card(written: StepAsWritten, world_size: int = 1) -> RunProfile:
    """How the step a recipe writes would run on a card of the GPU table where the question names none: `plan`
    without `--gpu` (its configuration and FP8's quality), the doctor on a CPU asked of a GPU's memory or of what
    the configuration measured on any card. Every card of the table is CUDA with bf16 (Ampere or newer), so
    the step resolves alike on each (precision, Liger; tested): the card's name and peaks are left out."""
    return run_profile(written, Machine("cuda", bf16=True), world_size)


def measured_card(device: str) -> Machine:
    """The card a figure was measured on, by the name CUDA gave it (a check's parts ran in processes of their
    own): its row of the table where it has one, under CUDA's name; else a CUDA card with bf16, as every card
    the table holds is."""
    gpu = find_gpu(device)
    if gpu is None:
        return Machine("cuda", name=device, bf16=True)
    return Machine(
        "cuda", name=device, gpu=gpu, bf16=True, capability=gpu.compute_capability, memory_bytes=gpu.memory_bytes
    )
