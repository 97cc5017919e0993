"""What a precision is: one row per precision a run can train in, and everything the package asks of it.

The run profile resolves the recipe's `mixed_precision` to one of these names (run_profile.py); the
loop, the memory estimate, the performance model, the measurement key, the doctor, `plan` and `check`
ask the row (`precision_named`) instead of naming a precision's word. Adding a precision like fp8 is a
row here and its choice in the recipe's `mixed_precision` (config/compute_section.py: the recipe is a
leaf and cannot import this table, so tests/test_precisions.py holds the two to the same names); one
that converts layers differently from fp8 also needs its converter (fp8.py is fp8's).

Every field is something the code branches on; a figure that belongs to a card (its peaks) stays in
machine/gpus.yaml and the row only says which of the card's peaks it runs at.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str  # the one vocabulary: the run profile's, the measurement key's, the logs'
    accelerate: str  # Accelerate's `mixed_precision` word (fp32 is its `no`)
    autocast: str | None  # the torch dtype of autocast ("bfloat16"); None: no autocast, fp32 everywhere
    # Bytes of an element its decoder linears multiply: 1 for fp8's float8 operands. A precision whose operands
    # are narrower than its autocast converts those linears (`converts_linears`) and casts them on every call.
    operand_bytes: int
    peak: str = (
        "bf16"  # which peak of the card's row of machine/gpus.yaml its converted linears run at (`<peak>_tflops`)
    )
    compute_capability: float | None = None  # the CUDA compute capability it needs, None: any card of the table
    hardware: str = ""  # what that capability brings, for the refusal ("FP8 tensor cores")
    architectures: str = ""  # the architectures that have it, for the refusal
    cpu_refusal: str | None = None  # why it cannot run on the CPU at all (fp16), None: it can, or can be emulated
    extra: str | None = None  # the pip extra its converter needs (`pip install -e '.[fp8]'`)
    package: str | None = None  # ... the distribution that extra brings, and the module the run imports from it
    module: str | None = None
    # The tokens it needs to reach bf16's loss, per bf16 token (1.0: the same loss after the same tokens); what
    # `plan` charges. Measured where not 1.0, with where it was measured and the range estimated at 1B.
    tokens_for_bf16_loss: float = 1.0
    quality_source: str | None = None
    tokens_for_bf16_loss_1b: tuple[float, float] | None = None

    @property
    def autocasts(self) -> bool:
        """Activations in a 16-bit dtype (bf16 or fp16 autocast; fp8 runs under bf16 autocast)."""
        return self.autocast is not None

    @property
    def activation_bytes(self) -> int:
        """Bytes of an activation element: 2 under autocast, 4 in fp32."""
        return 2 if self.autocasts else 4

    @property
    def converts_linears(self) -> bool:
        """Its decoder linears are converted to scaled matmuls on narrower operands (fp8.py's Float8Linear):
        where the size rule says it pays, at the card's `peak`, with casts on every call; `fp8_recipe` and
        `fp8_emulate` apply."""
        return self.autocasts and self.operand_bytes < self.activation_bytes

    @property
    def quality_per_token(self) -> float:
        """How much of a bf16 token one of its tokens is worth."""
        return 1 / self.tokens_for_bf16_loss


PRECISIONS = (
    Precision("bf16", accelerate="bf16", autocast="bfloat16", operand_bytes=2),
    Precision(
        "fp16",
        accelerate="fp16",
        autocast="float16",
        operand_bytes=2,
        cpu_refusal="Accelerate has no fp16 autocast and loss scaling on the CPU",
    ),
    # torchao's float8 for the decoder's linears where it pays (fp8.py), the rest as bf16 runs it. FP8 tensor
    # cores: Ada (8.9: L4, L40S, RTX 40xx), Hopper (9.0: H100, H200) and newer.
    Precision(
        "fp8",
        accelerate="fp8",
        autocast="bfloat16",
        operand_bytes=1,
        peak="fp8",
        compute_capability=8.9,
        hardware="FP8 tensor cores",
        architectures="Ada, Hopper, Blackwell",
        extra="fp8",
        package="torchao",
        module="torchao.float8",
        # `hf-pretrain bench --quality --variants mixed_precision=bf16,fp8` on a 1.48M-parameter proxy, three
        # seeds, FP8 emulated (docs/benchmarks.md, "FP8 vs bf16", 2026-11-25): 1.007x +/- 0.013 bf16's tokens.
        # At 1B that is the easy end: the same section estimates 1.01-1.11x (the proxy to nanochat's d26).
        tokens_for_bf16_loss=1.007,
        quality_source="measured on a 1.48M proxy (3 seeds, docs/benchmarks.md)",
        tokens_for_bf16_loss_1b=(1.01, 1.11),
    ),
    Precision("fp32", accelerate="no", autocast=None, operand_bytes=4),
)
NAMES = tuple(p.name for p in PRECISIONS)
_BY_NAME = {p.name: p for p in PRECISIONS}


def precision_named(name: str) -> Precision:
    """The row of `name` (the one vocabulary: `bf16`, `fp16`, `fp8`, `fp32`). Raises KeyError for another word:
    the recipe's `auto` and `no` are the run profile's to resolve (run_profile.resolve_precision)."""
    return _BY_NAME[name]
