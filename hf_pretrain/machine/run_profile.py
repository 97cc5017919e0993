"""How a run executes: one resolved, frozen answer, built once and read everywhere.

A `RunProfile` is the recipe met with a machine: this one (`this_machine()`, asked of torch once, with
`ACCELERATE_USE_CPU` honoured the way Accelerate honours it) or a card about to be rented
(`machine_with("H100")`, from machine/gpus.yaml). It holds

- the machine: cpu, cuda or mps, the card and its row of the GPU table, bf16, compute capability;
- the precision in one vocabulary (`bf16`, `fp16`, `fp8`, `fp32`): `mixed_precision: auto` is bf16 on
  a GPU that has it and fp32 everywhere else, decided here and nowhere else;
- the step: compiled (whole model or regions), the loss path (stock, chunked, Liger's), Liger's kernels
  (CUDA only), checkpointed layers, optimizer, micro-batch, TF32, the FP8 recipe, world size.

The loop, the memory estimate, the performance model, the measurement key, the doctor, `plan` and
`bench` read it; none of them reads the recipe's `mixed_precision` or asks torch for the device
(tests/test_architecture.py holds them to it). What each precision is (its Accelerate word, its
operands, the peak it runs at, the capability it needs) is a row of precisions.py, which this module
and every reader ask (`Step.precision_facts`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from hf_pretrain.config import StepAsWritten
from hf_pretrain.machine.gpus import GPU, find_gpu, gpu_named
from hf_pretrain.machine.precisions import Precision, precision_named

if TYPE_CHECKING:  # torch is imported where the machine is asked: `plan` and `stop` never do
    import torch


@dataclass(frozen=True)
class Machine:
    """Where a run executes: this machine as torch sees it, or a card of the GPU table by name."""

    kind: str  # "cpu", "cuda" or "mps"
    name: str | None = None  # CUDA's name of the card ("NVIDIA H100 80GB HBM3"), or the table's for a rented one
    gpu: GPU | None = None  # its row of machine/gpus.yaml; None for a CPU or a card the table lacks
    bf16: bool = False  # bf16 tensor cores (autocast in bf16)
    capability: float | None = None  # CUDA compute capability, 9.0 for an H100
    memory_bytes: int | None = None  # the card's memory

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def gpu_name(self) -> str | None:
        """CUDA's name of the card, or None off CUDA (a CPU, Apple's mps, `ACCELERATE_USE_CPU`): what a
        measurement is recorded under and a check's figures are labelled with."""
        return self.name if self.on_gpu else None

    def runs(self, precision: Precision) -> bool:
        """The tensor cores `precision` needs (its compute capability, and, for a card of the table, the
        peak it runs at listed); a precision that needs none runs anywhere."""
        if precision.compute_capability is None:
            return True
        has_peak = self.gpu is None or self.gpu.flops_at(precision.peak) is not None
        return self.capability is not None and self.capability >= precision.compute_capability and has_peak

    def lacks(self, precision: Precision) -> str | None:
        """What this machine lacks for `precision` (one line), or None where it has it."""
        if self.runs(precision):
            return None
        has = f"{self.name} has {self.capability:.1f}" if self.capability is not None else "no GPU"
        return (
            f"mixed_precision={precision.name} needs {precision.hardware} (compute capability "
            f"{precision.compute_capability} or newer: {precision.architectures}); {has}"
        )

    def refusal(self, precision: Precision) -> str | None:
        """`lacks` with the fix that works on a rented card."""
        missing = self.lacks(precision)
        return f"{missing}: --mixed_precision bf16, or a GPU such as the H100" if missing else None

    @property
    def peak_flops(self) -> float | None:
        """The card's dense bf16 peak from the GPU table (MFU), or None (a CPU, a card the table lacks)."""
        return self.gpu.bf16_flops if self.gpu else None


# The CPU, as `this_machine` finds it. No card stands in where none is named: a what-if names its card
# (machine/what_if.py), and a door hands down the machine it is on.
THE_CPU = Machine("cpu")


def accelerate_uses_cpu() -> bool:
    """`ACCELERATE_USE_CPU` (`accelerate launch --cpu`): the run stays on the CPU beside a GPU."""
    return os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")


@cache
def device_kind() -> str:
    """ "cuda", "mps" or "cpu": where a run here goes, `ACCELERATE_USE_CPU` honoured. Asking this does
    not initialise CUDA (no context on the GPU: the bench's children and each rank's device stay free)."""
    import torch

    if accelerate_uses_cpu():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


@cache
def this_machine() -> Machine:
    """This machine as a run here sees it: its CUDA device (the current one: a rank's own once Accelerate
    has set it), unless Accelerate is told to use the CPU; Apple's mps; else the CPU. Asked of torch once
    per process; a GPU's facts initialise CUDA, so a process that hands the GPU to children asks
    `device_kind` until they are done."""
    kind = device_kind()
    if kind != "cuda":
        return Machine(kind, name="Apple mps") if kind == "mps" else THE_CPU
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return Machine(
        "cuda",
        name=props.name,
        gpu=find_gpu(props.name),
        bf16=torch.cuda.is_bf16_supported(),
        capability=props.major + props.minor / 10,
        memory_bytes=props.total_memory,
    )


def refusal_for(gpu: GPU, precision: Precision) -> str | None:
    """Why the table's `gpu` cannot train in `precision` (one line with the fix), or None where it can."""
    return machine_with(gpu).refusal(precision)


def machine_with(gpu: GPU | str) -> Machine:
    """A card of the GPU table (by row or by name) as a run would find it: the question `plan` and the
    doctor's cost check ask for a GPU about to be rented. Raises ValueError for a name the table lacks."""
    row = gpu_named(gpu) if isinstance(gpu, str) else gpu
    # every card of the table is Ampere or newer: all have bf16
    return Machine(
        "cuda", name=row.name, gpu=row, bf16=True, capability=row.compute_capability, memory_bytes=row.memory_bytes
    )


def resolve_precision(requested: str, machine: Machine) -> str:
    """The recipe's `mixed_precision` in the one vocabulary: `auto` is bf16 on a GPU that has it and fp32
    elsewhere (the CPU included: bf16 autocast there is asked for by name); `no` is fp32."""
    if requested == "auto":
        return "bf16" if machine.on_gpu and machine.bf16 else "fp32"
    return "fp32" if requested == "no" else requested


def accelerate_word(precision: str) -> str:
    """Accelerate's `mixed_precision` for a precision of the one vocabulary (fp32 is its `no`)."""
    return precision_named(precision).accelerate


@dataclass(frozen=True)
class Step:
    """How one training step runs: what changes its speed and memory but not its math. The memory
    estimate, the performance model and the measurement key read these fields, and no others."""

    precision: str = "bf16"  # bf16, fp16, fp8 (the decoder's linears), fp32 (tf32 matmuls when allowed)
    compiled: bool = True  # torch.compile: the whole model, or one decoder layer at a time (compile_regions)
    compile_regions: bool = False
    liger: bool = False  # Liger's kernels and fused loss: only where they run (CUDA)
    chunked_loss: bool = False  # hf_pretrain/model/loss.py's chunked loss, where Liger's does not replace it
    optimizer: str = "adamw"  # or "muon"
    micro_batch_size: int = 8
    checkpointed_layers: int = 0
    tf32: bool = True
    fp8_recipe: str | None = None  # tensorwise or rowwise scaling, where the precision converts linears (fp8)
    fp8_emulate: bool = False  # the converted linears' casts and scales with the matmuls in fp32 (a CPU test)
    attention_backend: str = "auto"  # SDPA's kernel (attention.py); the performance model prices each
    world_size: int = 1

    @property
    def compiled_head(self) -> bool:
        """The final norm and the loss inside the compiled graph (whole-model compile)."""
        return self.compiled and not self.compile_regions

    @property
    def fused_loss(self) -> bool:
        """A loss that computes its gradients in the forward pass, a chunk of tokens at a time."""
        return self.liger or self.chunked_loss

    @property
    def precision_facts(self) -> Precision:
        """What the step's precision is (precisions.py): its operands, peak, autocast, needs."""
        return precision_named(self.precision)

    @property
    def autocast(self) -> bool:
        """Activations in a 16-bit dtype (bf16 or fp16 autocast; fp8 runs under bf16 autocast)."""
        return self.precision_facts.autocasts

    @property
    def compute_bytes(self) -> int:
        """Bytes of an activation element."""
        return self.precision_facts.activation_bytes

    def kernels(self) -> str:
        """`compiled + Liger, bf16`: what decides the step's activations (the memory estimate's words)."""
        how = ("compiled" if self.compiled else "eager") + (" regions" if self.compile_regions else "")
        how += (" + Liger" if self.liger else "") + (" + chunked loss" if self.chunked_loss else "")
        return f"{how}, {self.precision}"

    def describe(self) -> str:
        return (
            f"{self.kernels()}, {self.optimizer}, micro-batch {self.micro_batch_size}, "
            f"{self.checkpointed_layers} layers checkpointed"
        )

    def key(self) -> dict:
        """The step's part of a measurement's key (economics/measurements.py)."""
        return {
            "micro_batch_size": self.micro_batch_size,
            "compile": self.compiled,
            "compile_regions": self.compiled and self.compile_regions,
            "liger": self.liger,
            "checkpointed_layers": self.checkpointed_layers,
            "optimizer": self.optimizer,
            "chunked_loss": self.chunked_loss,
            "precision": self.precision,
            "fp8_recipe": self.fp8_recipe,  # tensorwise and rowwise differ in speed
            "world_size": self.world_size,
        }


@dataclass(frozen=True)
class RunProfile:
    """A recipe on a machine: how its run executes."""

    machine: Machine
    step: Step
    asked_precision: str = "auto"  # the recipe's own word (`auto` and `no` included), for messages that quote it
    attention_why: str | None = None  # the line that says why `auto` became the step's kernel, when it did

    @property
    def precision(self) -> str:
        return self.step.precision

    @property
    def accelerate_precision(self) -> str:
        """What Accelerate is told (`no` for fp32)."""
        return accelerate_word(self.step.precision)

    def describe(self) -> str:
        where = self.machine.name or self.machine.kind
        return f"{where}: {self.step.describe()}, {self.step.world_size} process(es)"


def run_profile(
    written: StepAsWritten,
    machine: Machine,
    world_size: int = 1,
    micro_batch_size: int | None = None,
    checkpointed_layers: int | None = None,
    attention: tuple[str, str | None] | None = None,
) -> RunProfile:
    """How the step a recipe writes (`recipe.step_as_written`) runs on `machine` (`this_machine()`, asked at
    a command's door, or a card of the table, `machine_with`, for a what-if) with `world_size` processes;
    the micro-batch and checkpointed layers are the recipe's unless given (`plan`'s and the doctor's what-ifs).
    `attention`: the SDPA kernel as it will run and why, where a door resolved `auto` from a check's
    records (economics/resolved_run.complete_profile); else the recipe's word."""
    compute = written.compute
    precision = resolve_precision(compute.mixed_precision, machine)
    converts = precision_named(precision).converts_linears  # fp8's scaling and emulation keys apply
    liger = compute.liger and machine.on_gpu  # without CUDA, training uses the standard kernels (model.apply_liger)
    step = Step(
        precision=precision,
        compiled=compute.compile,
        compile_regions=compute.compile and compute.compile_regions,
        liger=liger,
        chunked_loss=compute.chunked_loss and not liger,
        optimizer=written.optimizer,
        micro_batch_size=micro_batch_size or written.micro_batch_size,
        checkpointed_layers=written.checkpointed_layers if checkpointed_layers is None else checkpointed_layers,
        tf32=compute.tf32,
        fp8_recipe=compute.fp8_recipe if converts else None,
        fp8_emulate=converts and compute.fp8_emulate,
        attention_backend=attention[0] if attention else compute.attention_backend,
        world_size=world_size,
    )
    return RunProfile(machine, step, compute.mixed_precision, attention[1] if attention else None)


def with_step(profile: RunProfile, **changes) -> RunProfile:
    """The same run with some of its step's settings changed."""
    return dataclasses.replace(profile, step=dataclasses.replace(profile.step, **changes))


def inference_device_and_dtype(machine: Machine) -> tuple[str, torch.dtype]:
    """Where and in what dtype to run a model for evaluation on `machine`: a GPU in bf16 (fp16 where bf16
    is missing, fine for inference), else the CPU in fp32."""
    import torch

    if machine.on_gpu:
        return "cuda", torch.bfloat16 if machine.bf16 else torch.float16
    return "cpu", torch.float32
