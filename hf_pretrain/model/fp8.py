"""FP8 training (`mixed_precision: fp8`): the decoder's linear layers run torchao's Float8Linear.

Accelerate's torchao backend does the conversion in `prepare` (`AORecipeKwargs`): each selected
`nn.Linear` becomes a `Float8Linear` that keeps its fp32 weight (the master copy the optimizer
updates, as in a bf16 run) and, in every forward and backward, casts the weight, the input and the
output gradient to float8 with a scale and multiplies them with `torch._scaled_mm`. Everything else
stays as a bf16 run has it: bf16 autocast (Accelerate's `fp8` turns it on), the embedding, the tied
head and the loss. Only the decoder's projections go FP8: the head's input is the whole model's
output and its logits feed the loss, where FP8's 3 mantissa bits cost the most per FLOP saved.

And only the projections where FP8 pays (`pays_in_fp8`): a matmul too small gains less from FP8's
rate than its casts to float8 cost. The rule is torchao's, stated in its float8 README's performance
tables (H100, compiled, forward + backward of one linear, the speed-up by shape) and in its
`_auto_filter_for_recipe`: with tensorwise scaling a layer of at most 4096 inputs and 1024 outputs is
slower in FP8; with rowwise scaling, one of at most 2048 outputs, or 1024 inputs, or 4096 outputs and
2048 inputs. For the `1b` (hidden 2048, 8 KV heads of 64, MLP 8192) tensorwise keeps the 2048 x 512 K
and V projections in bf16 and converts q, o, gate, up and down; rowwise converts gate and up alone.
The performance model prices the same split (economics/workload.py); tests/test_fp8.py names the
layers of the 1b. An emulated run (`fp8_emulate`) is never faster, so speed decides nothing there:
it converts every decoder projection (with shapes `_scaled_mm` takes), so the CPU checks the FP8 math
on all of them and a quality proxy's cost is an upper bound of what the size rule's run pays.

`fp8_recipe` picks torchao's scaling: `tensorwise` (one scale per tensor, the fastest) or `rowwise`
(one per row: finer, for outliers, slower on Hopper). `fp8_emulate` runs the same casts and scales
with the matmul emulated in fp32, so the CPU and CI run the FP8 math without an FP8 GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_pretrain.config.compute_section import SCALED_MATMUL_MULTIPLE
from hf_pretrain.machine.run_profile import Step

if TYPE_CHECKING:  # imported where a model is built: the size rule, which `plan` asks, needs no torch
    import torch

# torch._scaled_mm wants both dimensions of every FP8 operand to be multiples of 16 (the recipe checks it too).
SCALED_MM_MULTIPLE = SCALED_MATMUL_MULTIPLE
# Where the decoder's layers live in a LlamaForCausalLM: `model.layers.<i>.self_attn.q_proj`, ...
DECODER_LAYERS = "model.layers."


def pays_in_fp8(in_features: int, out_features: int, fp8_recipe: str) -> bool:
    """Whether a linear layer of this shape is faster in FP8 than in bf16 under `fp8_recipe`'s scaling
    (torchao's size rule, module docstring), and `_scaled_mm` takes its shape at all."""
    if in_features % SCALED_MM_MULTIPLE or out_features % SCALED_MM_MULTIPLE:
        return False
    if fp8_recipe == "rowwise":
        return not (out_features <= 2048 or in_features <= 1024 or (out_features <= 4096 and in_features <= 2048))
    return not (in_features <= 4096 and out_features <= 1024)


def decoder_linear_filter(fp8_recipe: str, everywhere: bool = False):
    """The module filter for `fp8_recipe`: a linear layer inside a decoder layer (attention and MLP
    projections) where FP8 pays, or every one `_scaled_mm` takes with `everywhere` (emulation). The head
    (`lm_head`, tied to the embedding) is not one: it stays bf16."""

    def pays(in_features: int, out_features: int) -> bool:
        if everywhere:
            return in_features % SCALED_MM_MULTIPLE == 0 and out_features % SCALED_MM_MULTIPLE == 0
        return pays_in_fp8(in_features, out_features, fp8_recipe)

    def selected(module: torch.nn.Module, fqn: str) -> bool:
        import torch

        return (
            isinstance(module, torch.nn.Linear)
            and fqn.startswith(DECODER_LAYERS)
            and pays(module.in_features, module.out_features)
        )

    return selected


def import_torchao_float8():
    """`torchao.float8` (what it logs on import without its CUDA kernels is filtered: hf_pretrain/__init__.py)."""
    import torchao.float8

    return torchao.float8


def float8_config(step: Step):
    """torchao's `Float8LinearConfig` for the step's `fp8_recipe`, emulated with `fp8_emulate`."""
    import dataclasses

    Float8LinearConfig = import_torchao_float8().Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(step.fp8_recipe)
    # from_recipe_name returns a frozen dataclass; `replace` re-runs its checks with emulation on
    return dataclasses.replace(config, emulate=step.fp8_emulate)


def fp8_handlers(step: Step) -> list:
    """The Accelerator's kwargs handlers for FP8: torchao's backend with our config and module
    filter (Accelerate's own default would also skip the first decoder projection); none otherwise."""
    if not step.precision_facts.converts_linears:
        return []
    from accelerate.utils import AORecipeKwargs

    return [
        AORecipeKwargs(
            config=float8_config(step), module_filter_func=decoder_linear_filter(step.fp8_recipe, step.fp8_emulate)
        )
    ]


def float8_layers(model: torch.nn.Module) -> list[str]:
    """Names of the model's Float8Linear layers (none in a bf16 or fp32 run)."""
    from hf_pretrain.versions import installed_version

    if installed_version("torchao") is None:
        return []
    Float8Linear = import_torchao_float8().float8_linear.Float8Linear
    return [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]


def cast_fp8_inputs_to_autocast_dtype(model: torch.nn.Module) -> None:
    """Off CUDA, give each Float8Linear its input in the autocast dtype, as it does itself on CUDA.

    Float8Linear casts its input to CUDA's autocast dtype only (`torch.is_autocast_enabled()` asks
    CUDA); under the CPU's bf16 autocast the q/k/v, gate and up projections would take the RMSNorm's
    output in fp32 (its fp32 weight promotes it): their scales would come from fp32 values, not the
    bf16 ones a GPU scales, and the backward would keep fp32 inputs. The pre-hook makes the CPU run
    what a GPU runs. Registered after `prepare` and before the first step, so the compiled graph
    (traced at the first call) has it.
    """
    for name in float8_layers(model):
        model.get_submodule(name).register_forward_pre_hook(_input_in_autocast_dtype)


def finish_fp8(model: torch.nn.Module, step: Step) -> str | None:
    """After `prepare` converted the model: align the CPU's dtypes with a GPU's; the line for the log
    (None, and nothing done, for a step that does not train in fp8)."""
    if not step.precision_facts.converts_linears:
        return None
    cast_fp8_inputs_to_autocast_dtype(model)
    how = f"{step.fp8_recipe} scaling" + (", every projection, matmuls emulated in fp32" if step.fp8_emulate else "")
    layers = float8_layers(model)
    kinds = sorted({name.rsplit(".", 1)[-1] for name in layers})
    return (
        f"fp8: {len(layers)} decoder linear layers in float8 ({how}: {', '.join(kinds) or 'none'}); "
        f"the other projections (too small for FP8 to pay), embedding, head and loss in bf16"
    )


def _input_in_autocast_dtype(module: torch.nn.Module, args: tuple) -> tuple | None:
    import torch

    (x,) = args
    device_type = x.device.type
    if device_type != "cuda" and torch.is_autocast_enabled(device_type):
        return (x.to(torch.get_autocast_dtype(device_type)),)
    return None
