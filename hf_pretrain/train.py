"""Pretrain a Llama model from a recipe with an Accelerate loop.

One GPU:
    accelerate launch --config_file accelerate_configs/single_gpu.yaml hf_pretrain/train.py --recipe 1b
Several GPUs, the same recipe (gradient accumulation adapts to keep the tokens per step):
    accelerate launch --config_file accelerate_configs/ddp.yaml --num_processes 8 hf_pretrain/train.py --recipe 1b
CPU, in minutes (after `hf-pretrain prepare --recipe smoke`):
    accelerate launch --cpu --num_processes 1 hf_pretrain/train.py --recipe smoke

Any recipe key can be overridden: `--max_steps 100 --output_dir runs/try`. `--help` lists them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from hf_pretrain.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint
from hf_pretrain.config import Recipe, parse_recipe_args, save_recipe
from hf_pretrain.data import build_train_loader, build_val_loader, check_prepared_data, load_tokenizer
from hf_pretrain.metrics import (
    JsonlWriter,
    ThroughputMeter,
    device_peak_flops,
    peak_memory_gib,
    trackers_for,
    truncate_jsonl,
)
from hf_pretrain.model import apply_liger, build_model, count_parameters, flops_per_token, llama_config
from hf_pretrain.optim import build_optimizer, learning_rate_at, set_learning_rate


def resolve_mixed_precision(requested: str) -> str:
    """`auto` means bf16 where the GPU supports it and full fp32 on CPU."""
    if requested != "auto":
        return requested
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def train(recipe: Recipe) -> Path | None:
    """Run the recipe to `max_steps` (resuming when asked) and return the `final/` model folder,
    or None when the run stopped early at `stop_at_step` with a checkpoint."""
    train_cfg = recipe.train
    out = Path(train_cfg.output_dir)
    # Without CUDA the processes must run on the CPU; saying so up front is what makes Accelerate
    # join processes started by torchrun (`accelerate launch --multi_gpu`) into a gloo group.
    on_cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    world_size = PartialState(cpu=on_cpu).num_processes
    grad_accum = recipe.grad_accum_steps(world_size)

    # ---- plumbing first: data and tokenizer must match the recipe before anything is built
    check_prepared_data(recipe)
    tokenizer = load_tokenizer(recipe.data.data_dir)

    accelerator = Accelerator(
        cpu=on_cpu,
        mixed_precision=resolve_mixed_precision(train_cfg.mixed_precision),
        gradient_accumulation_steps=grad_accum,
        log_with=trackers_for(train_cfg.report_to) or None,
        project_dir=str(out),
        dynamo_backend="inductor" if train_cfg.compile else "no",
    )
    say = accelerator.print
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, out / "resolved_recipe.yaml")
    if torch.cuda.is_available() and train_cfg.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # ---- model and optimizer
    set_seed(train_cfg.seed)
    config = llama_config(recipe.model, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                          tokenizer.pad_token_id)
    model = build_model(config)
    n_params = count_parameters(model)
    if train_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if train_cfg.liger:
        apply_liger(model, log=say)
    optimizer = build_optimizer(model, train_cfg, fused=accelerator.device.type == "cuda")
    model, optimizer = accelerator.prepare(model, optimizer)

    # ---- resume: weights, optimizer and RNG from the checkpoint; data position from its sidecar
    state = {"step": 0, "tokens_seen": 0, "elapsed_seconds": 0.0, "recipe_fingerprint": recipe.fingerprint()}
    resume_from = find_resume_checkpoint(out, train_cfg.resume, log=say)
    if resume_from is not None:
        saved = load_checkpoint(accelerator, resume_from)
        if saved.get("recipe_fingerprint") != state["recipe_fingerprint"]:
            say(f"warning: {resume_from} was written by a recipe with different math settings; continuing with the new ones")
        state.update(saved, recipe_fingerprint=state["recipe_fingerprint"])
        say(f"resumed from {resume_from} at step {state['step']}")
    if accelerator.is_main_process:
        # a resumed run rewrites the steps after its checkpoint, so the files hold one clean curve
        truncate_jsonl(out / "metrics.jsonl", after_step=state["step"])
        truncate_jsonl(out / "samples.jsonl", after_step=state["step"])
    metrics = JsonlWriter(out / "metrics.jsonl", accelerator.is_main_process)
    samples = JsonlWriter(out / "samples.jsonl", accelerator.is_main_process)
    accelerator.init_trackers("hf-pretrain", config=_flat_config(recipe))

    train_loader = build_train_loader(recipe, accelerator.process_index, world_size, grad_accum,
                                      start_step=state["step"], pin_memory=accelerator.device.type == "cuda")
    val_loader = build_val_loader(recipe, accelerator.process_index, world_size)
    tokens_per_step = train_cfg.global_batch_tokens
    meter = ThroughputMeter(flops_per_token(config, n_params, recipe.data.seq_len),
                            device_peak_flops(accelerator.device), world_size)
    say(f"model: {n_params / 1e6:.2f}M parameters | {world_size} process(es) x {grad_accum} micro-batches of "
        f"{train_cfg.micro_batch_size} x {recipe.data.seq_len} tokens = {tokens_per_step:,} tokens/step | "
        f"precision {accelerator.mixed_precision}")

    def evaluate_and_sample(step: int) -> None:
        started = meter.pause()
        val_loss = evaluate(accelerator, model, val_loader)
        record = {"kind": "eval", "step": step, "tokens": state["tokens_seen"], "val_loss": val_loss}
        metrics.write(record)
        accelerator.log({"val/loss": val_loss}, step=step)
        for prompt, text in generate_samples(accelerator, model, tokenizer, train_cfg.prompts,
                                             train_cfg.sample_max_new_tokens):
            samples.write({"step": step, "tokens": state["tokens_seen"], "prompt": prompt, "completion": text})
        say(f"step {step}: val_loss {val_loss:.4f}")
        meter.skip(meter.pause() - started)

    def checkpoint() -> None:
        started = meter.pause()
        state["elapsed_seconds"] = elapsed()
        path = save_checkpoint(accelerator, out, dict(state), train_cfg.keep_checkpoints, config, tokenizer)
        say(f"step {state['step']}: saved {path}")
        meter.skip(meter.pause() - started)

    run_start, elapsed_before = time.perf_counter(), state["elapsed_seconds"]

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - run_start

    # ---- the loop: one iteration is one optimizer step of `tokens_per_step` tokens
    batches = iter(train_loader)
    model.train()
    progress = tqdm(total=train_cfg.max_steps, initial=state["step"], disable=not accelerator.is_main_process,
                    desc="train", dynamic_ncols=True)
    loss_sum, loss_count = torch.zeros((), device=accelerator.device), 0  # micro-batch losses since the last log
    while state["step"] < train_cfg.max_steps:
        lr = learning_rate_at(state["step"], train_cfg)
        set_learning_rate(optimizer, lr)
        for _ in range(grad_accum):
            tokens = next(batches).to(accelerator.device, non_blocking=True)
            inputs, targets = tokens[:, :-1], tokens[:, 1:].contiguous()
            with accelerator.accumulate(model):
                # the targets are already shifted; `shift_labels` tells the loss not to shift again
                loss = model(input_ids=inputs, labels=targets, shift_labels=targets).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), train_cfg.grad_clip or float("inf"))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
            loss_count += 1
        state["step"] += 1
        state["tokens_seen"] += tokens_per_step
        meter.add(tokens_per_step)
        progress.update(1)
        step = state["step"]

        if step % train_cfg.log_interval == 0 or step == train_cfg.max_steps:
            loss_value = accelerator.reduce(loss_sum / loss_count, "mean").item()
            loss_sum.zero_()
            loss_count = 0
            tokens_per_s, mfu = meter.read()
            record = {"kind": "train", "step": step, "tokens": state["tokens_seen"], "loss": loss_value, "lr": lr,
                      "grad_norm": float(grad_norm), "tokens_per_s": tokens_per_s, "elapsed": elapsed()}
            if mfu is not None:
                record["mfu"] = mfu
                record["peak_memory_gib"] = peak_memory_gib(accelerator.device)
            metrics.write(record)
            accelerator.log({f"train/{k}": v for k, v in record.items() if k not in ("kind", "step")}, step=step)
            progress.set_postfix(loss=f"{loss_value:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                 **({"mfu": f"{mfu:.1%}"} if mfu is not None else {}))
        if train_cfg.eval_interval and (step % train_cfg.eval_interval == 0 or step == train_cfg.max_steps):
            evaluate_and_sample(step)
        stopping_early = step == train_cfg.stop_at_step
        if step % train_cfg.save_interval == 0 or step == train_cfg.max_steps or stopping_early:
            checkpoint()
        if stopping_early:
            progress.close()
            say(f"stopped at step {step} as asked (stop_at_step); rerun the same command to continue")
            accelerator.end_training()
            return None
    progress.close()

    final = save_final_model(accelerator, model, tokenizer, out / "final")
    say(f"done: {state['step']} steps, {state['tokens_seen']:,} tokens in {elapsed():.0f}s | "
        f"metrics {out / 'metrics.jsonl'} | samples {out / 'samples.jsonl'} | model {final}")
    accelerator.end_training()
    return final


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: torch.nn.Module, val_loader) -> float:
    """Mean loss over the held-out batches, averaged over every process."""
    model.eval()
    total = torch.zeros((), device=accelerator.device)
    count = 0
    for tokens in val_loader:
        tokens = tokens.to(accelerator.device)
        targets = tokens[:, 1:].contiguous()
        total += model(input_ids=tokens[:, :-1], labels=targets, shift_labels=targets).loss.float()
        count += 1
    model.train()
    return accelerator.reduce(total / max(count, 1), "mean").item()


@torch.no_grad()
def generate_samples(accelerator: Accelerator, model: torch.nn.Module, tokenizer, prompts: list[str],
                     max_new_tokens: int) -> list[tuple[str, str]]:
    """Greedy completions of the fixed prompts. Every process generates (FSDP needs them all)."""
    net = accelerator.unwrap_model(model)
    net.eval()
    completions = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids.to(accelerator.device)
        with accelerator.autocast():
            out = net.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True,
                               eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        completions.append((prompt, tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)))
    net.train()
    return completions


def save_final_model(accelerator: Accelerator, model: torch.nn.Module, tokenizer, folder: Path) -> Path:
    """A standard Hugging Face folder (safetensors, config, tokenizer) that from_pretrained loads."""
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP shards onto the main process
    net = accelerator.unwrap_model(model)
    net.config.use_cache = True
    net.save_pretrained(folder, state_dict=state_dict, is_main_process=accelerator.is_main_process,
                        save_function=accelerator.save)
    if accelerator.is_main_process:
        tokenizer.save_pretrained(folder)
    accelerator.wait_for_everyone()
    return folder


def _flat_config(recipe: Recipe) -> dict:
    """The recipe as one flat dict of scalars, the shape trackers accept."""
    flat = {}
    for section in ("model", "data", "train"):
        for key, value in recipe.to_dict()[section].items():
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def main(argv: list[str] | None = None) -> int:
    recipe, _ = parse_recipe_args(argv, prog="train.py", description=__doc__.split("\n")[0])
    train(recipe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
