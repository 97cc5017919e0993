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

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from hf_pretrain.config import Recipe, TrainConfig, parse_recipe_args, save_recipe
from hf_pretrain.data import build_train_loader, build_val_loader, load_tokenizer
from hf_pretrain.economics.cost import cost_record, phases_from_recipe, write_phase_table
from hf_pretrain.hardware import describe_hardware, device_peak_flops, peak_memory_gib, training_precision
from hf_pretrain.model import apply_liger, build_model, count_parameters, flops_per_token, llama_config
from hf_pretrain.optim import build_optimizer, learning_rate_at, set_learning_rate
from hf_pretrain.preflight import PreflightError, preflight
from hf_pretrain.publish.export import export_checkpoint, push_checkpoint, resolve_checkpoint
from hf_pretrain.publish.hub import HubError, push_folder
from hf_pretrain.run_dir import FINAL_DTYPE, JsonlWriter, read_jsonl, truncate_jsonl
from hf_pretrain.training.checkpoint import CheckpointSaveError, resume_training_state, save_checkpoint
from hf_pretrain.training.early_stopping import EarlyStop
from hf_pretrain.training.faults import fault_active
from hf_pretrain.training.metrics import ThroughputMeter, trackers_for
from hf_pretrain.training.signals import (
    EXIT_DIVERGED,
    EXIT_PREEMPTED,
    EXIT_PREFLIGHT,
    EXIT_SAVE_FAILED,
    GracefulStop,
    any_process,
)


@dataclass
class Outcome:
    """How a call to `train` ended: the process exit code, a line for the user, the final model."""

    exit_code: int
    message: str
    final_model: Path | None = None


def train(recipe: Recipe) -> Outcome:
    """Run the recipe to `max_steps`, resuming when asked, and write `final/`.

    Stops early, always with a checkpoint, on `stop_at_step`, on SIGTERM/SIGINT, or after
    `max_bad_steps` non-finite steps in a row; a checkpoint that cannot be written stops it too.
    """
    train_cfg = recipe.train
    out = Path(train_cfg.output_dir)
    # Without CUDA the processes must run on the CPU; saying so up front is what makes Accelerate
    # join processes started by torchrun (`accelerate launch --multi_gpu`) into a gloo group.
    on_cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    world_size = PartialState(cpu=on_cpu).num_processes
    grad_accum = recipe.grad_accum_steps(world_size)

    # ---- plumbing first: versions, device, data, disk and memory, before anything is built
    is_main = PartialState().is_main_process
    preflight(recipe, world_size, log=print if is_main else lambda _: None)
    tokenizer = load_tokenizer(recipe.data.data_dir)

    accelerator = Accelerator(
        cpu=on_cpu,
        mixed_precision=training_precision(train_cfg.mixed_precision),
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
    state = {"step": 0, "tokens_seen": 0, "elapsed_seconds": 0.0, "skipped_steps": 0,
             "recipe_fingerprint": recipe.fingerprint(), "hardware": describe_hardware(accelerator.device, accelerator.num_processes)}
    resumed = resume_training_state(accelerator, out, train_cfg.resume, log=say)
    if resumed is not None:
        folder, saved = resumed
        if saved.get("recipe_fingerprint") != state["recipe_fingerprint"]:
            say(f"warning: {folder} was written by a recipe with different math settings; continuing with the new ones")
        state.update(saved, recipe_fingerprint=state["recipe_fingerprint"], hardware=state["hardware"])
        say(f"resumed from {folder} at step {state['step']}")
    if accelerator.is_main_process:
        # a resumed run rewrites the steps after its checkpoint, so the files hold one clean curve
        truncate_jsonl(out / "metrics.jsonl", after_step=state["step"])
        truncate_jsonl(out / "samples.jsonl", after_step=state["step"])
        truncate_jsonl(out / "benchmarks.jsonl", after_step=state["step"])
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

    run_start, elapsed_before = time.perf_counter(), state["elapsed_seconds"]

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - run_start

    def evaluate_and_sample(step: int) -> float:
        started = meter.pause()
        val_loss = evaluate(accelerator, model, val_loader)
        metrics.write({"kind": "eval", "step": step, "tokens": state["tokens_seen"], "val_loss": val_loss})
        accelerator.log({"val/loss": val_loss}, step=step)
        for prompt, text in generate_samples(accelerator, model, tokenizer, train_cfg.prompts,
                                             train_cfg.sample_max_new_tokens):
            samples.write({"step": step, "tokens": state["tokens_seen"], "prompt": prompt, "completion": text})
        say(f"step {step}: val_loss {val_loss:.4f}")
        meter.skip(meter.pause() - started)
        return val_loss

    def checkpoint() -> Path:
        started = meter.pause()
        state["elapsed_seconds"] = elapsed()
        path = save_checkpoint(accelerator, out, dict(state), train_cfg.keep_checkpoints, config, tokenizer,
                               train_cfg.milestone_interval)
        say(f"step {state['step']}: saved {path}")
        if accelerator.is_main_process:
            publish_checkpoint(path, state["step"], train_cfg, say)
        accelerator.wait_for_everyone()
        meter.skip(meter.pause() - started)  # saving, pushing and scoring stay out of tokens/s
        return path

    def stop(exit_code: int, message: str) -> Outcome:
        progress.close()
        say(message)
        accelerator.end_training()
        return Outcome(exit_code, message)

    # ---- the loop: one iteration is one optimizer step of `tokens_per_step` tokens
    batches = iter(train_loader)
    model.train()
    progress = tqdm(total=train_cfg.max_steps, initial=state["step"], disable=not accelerator.is_main_process,
                    desc="train", dynamic_ncols=True)
    history = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]  # for cost per phase
    phases = phases_from_recipe(train_cfg.phases)
    early_stop = EarlyStop(train_cfg)
    window_losses: list[float] = []  # this process's step losses since the last log line
    data_wait = 0.0  # seconds spent waiting for batches since the last log line
    recent_loss = None  # running average for spike detection
    bad_in_a_row = 0
    with GracefulStop(say) as signals:
        while state["step"] < train_cfg.max_steps:
            step = state["step"] + 1
            lr = learning_rate_at(state["step"], train_cfg)
            set_learning_rate(optimizer, lr)
            loss, waited = forward_backward(accelerator, model, batches, grad_accum,
                                            poison=fault_active("nan-loss", step))
            data_wait += waited
            # After the last micro-batch the gradients are synchronised, so every process sees the
            # same norm and takes the same decision: a non-finite step is skipped, weights untouched.
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), train_cfg.grad_clip or float("inf")).item()
            finite = math.isfinite(grad_norm) and math.isfinite(loss)
            if finite:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"], state["tokens_seen"] = step, state["tokens_seen"] + tokens_per_step
            meter.add(tokens_per_step)
            progress.update(1)

            if not finite:
                bad_in_a_row += 1
                state["skipped_steps"] += 1
                metrics.write({"kind": "skipped", "step": step, "loss": str(loss), "grad_norm": str(grad_norm)})
                say(f"step {step}: non-finite loss {loss} / grad norm {grad_norm}: step skipped, weights untouched "
                    f"({bad_in_a_row} in a row, stop at {train_cfg.max_bad_steps})")
                if bad_in_a_row >= train_cfg.max_bad_steps:
                    path = checkpoint()
                    return stop(EXIT_DIVERGED,
                                f"stopped: {bad_in_a_row} non-finite steps in a row. {path} holds the weights from "
                                f"before step {step - bad_in_a_row + 1} (skipped steps change nothing) with the data "
                                f"position past the bad batches; lower learning_rate or raise warmup_steps, then "
                                f"rerun to resume.")
                continue
            bad_in_a_row = 0
            if recent_loss is not None and loss > train_cfg.loss_spike_factor * recent_loss:
                metrics.write({"kind": "spike", "step": step, "loss": loss, "recent_loss": recent_loss})
                say(f"step {step}: loss spike {loss:.3f} against a recent average of {recent_loss:.3f}")
            recent_loss = loss if recent_loss is None else 0.9 * recent_loss + 0.1 * loss
            window_losses.append(loss)

            if step % train_cfg.log_interval == 0 or step == train_cfg.max_steps:
                mean_loss = accelerator.reduce(torch.tensor(sum(window_losses) / len(window_losses),
                                                            device=accelerator.device), "mean").item()
                window_losses.clear()
                window_seconds = meter.pause()
                tokens_per_s, mfu = meter.read()
                record = {"kind": "train", "step": step, "tokens": state["tokens_seen"], "loss": mean_loss, "lr": lr,
                          "grad_norm": grad_norm, "tokens_per_s": tokens_per_s, "elapsed": elapsed(),
                          "data_wait_share": min(1.0, data_wait / max(window_seconds, 1e-9))}
                data_wait = 0.0
                if mfu is not None:
                    record["mfu"] = mfu
                    record["peak_memory_gib"] = peak_memory_gib(accelerator.device)
                if train_cfg.price_per_hour:
                    record.update(cost_record(record, train_cfg))
                metrics.write(record)
                history.append(record)
                accelerator.log({f"train/{k}": v for k, v in record.items() if k not in ("kind", "step")}, step=step)
                progress.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                     **({"mfu": f"{mfu:.1%}"} if mfu is not None else {}))
            if train_cfg.eval_interval and (step % train_cfg.eval_interval == 0 or step == train_cfg.max_steps):
                early_stop.observe_val_loss(evaluate_and_sample(step))
            if any(phase.end_step == step for phase in phases) and accelerator.is_main_process:
                say(write_phase_table(out, history, [p for p in phases if p.end_step <= step], train_cfg.price_per_hour))
            if step % train_cfg.log_interval == 0:
                early_stop.observe_cost(history)
            stop_now = any_process(accelerator, early_stop.reason is not None and accelerator.is_main_process)

            preempted = signals.requested(accelerator)
            if preempted or stop_now or step == train_cfg.stop_at_step or step % train_cfg.save_interval == 0 \
                    or step == train_cfg.max_steps:
                try:
                    path = checkpoint()
                except CheckpointSaveError as exc:
                    return stop(EXIT_SAVE_FAILED, f"stopped: {exc}")
            if preempted:
                return stop(EXIT_PREEMPTED, f"stopped by {signals.signal_name or 'a signal to another process'} "
                                            f"after step {step}; checkpoint {path}. Rerun the same command to resume.")
            if step == train_cfg.stop_at_step:
                return stop(0, f"stopped at step {step} as asked (stop_at_step); rerun the same command to continue")
            if stop_now:
                say(f"early stop at step {step}: {early_stop.reason or 'decided on the main process'}")
                break
    progress.close()

    final = write_final_model(accelerator, out, train_cfg, say)
    message = (f"done: {state['step']} steps, {state['tokens_seen']:,} tokens in {elapsed():.0f}s | "
               f"metrics {out / 'metrics.jsonl'} | samples {out / 'samples.jsonl'} | model {final}")
    say(message)
    accelerator.end_training()
    return Outcome(0, message, final)


def forward_backward(accelerator: Accelerator, model: torch.nn.Module, batches, grad_accum: int,
                     poison: bool = False) -> tuple[float, float]:
    """Accumulate gradients over `grad_accum` micro-batches.

    Returns this process's mean loss and the seconds spent waiting for batches.
    """
    total = torch.zeros((), device=accelerator.device)
    waited = 0.0
    for _ in range(grad_accum):
        before = time.perf_counter()
        tokens = next(batches)
        waited += time.perf_counter() - before
        tokens = tokens.to(accelerator.device, non_blocking=True)
        inputs, targets = tokens[:, :-1], tokens[:, 1:].contiguous()
        with accelerator.accumulate(model):  # no gradient all-reduce until the last micro-batch
            # the targets are already shifted; `shift_labels` tells the loss not to shift again
            loss = model(input_ids=inputs, labels=targets, shift_labels=targets).loss
            if poison:  # fault injection for the numerical-guard tests
                loss = loss * float("nan")
            accelerator.backward(loss)
        total += loss.detach()
    return (total / grad_accum).item(), waited


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


def write_final_model(accelerator: Accelerator, out: Path, train: TrainConfig, say) -> Path:
    """`final/`: the last checkpoint exported in fp32 as a standard Hugging Face folder with its
    model card; the same code path as `hf-pretrain export`, so FSDP shards are merged too."""
    final = out / "final"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        newest = resolve_checkpoint(out, checksums=False, log=say)  # the one this run just saved
        export_checkpoint(newest, final, dtype=FINAL_DTYPE, overwrite=True)
        if train.push_to_hub:
            try:
                say(f"pushed final/ to {push_folder(final, train.push_to_hub, private=train.push_private)}")
            except HubError as exc:
                say(f"warning: {exc}; push it later with `hf-pretrain export --checkpoint {out} --push-to-hub ...`")
    accelerator.wait_for_everyone()
    return final


def publish_checkpoint(path: Path, step: int, train: TrainConfig, say) -> None:
    """The optional side jobs of a saved checkpoint: push it to a `step-N` branch, score it on a few
    benchmarks. Neither may stop the run: a failure is logged and training goes on."""
    if train.push_checkpoints:
        try:
            say(f"step {step}: pushed to {push_checkpoint(path, train.push_to_hub, step, private=train.push_private)}")
        except HubError as exc:
            say(f"warning: step {step} was not pushed: {exc}")
    if train.benchmark_tasks:
        from hf_pretrain.evaluation.harness import evaluate_checkpoint  # lm-eval is the optional `eval` extra

        try:
            record = evaluate_checkpoint(path, train.benchmark_tasks, train.benchmark_limit,
                                         data_dir=train.benchmark_data_dir)
            say(f"step {step}: benchmarks {record['tasks']}")
        except Exception as exc:  # a benchmark is a measurement, never a reason to lose the run
            say(f"warning: step {step} benchmarks failed: {type(exc).__name__}: {exc}")


def _flat_config(recipe: Recipe) -> dict:
    """The recipe as one flat dict of scalars, the shape trackers accept."""
    flat = {}
    for section in ("model", "data", "train"):
        for key, value in recipe.to_dict()[section].items():
            flat[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def main(argv: list[str] | None = None) -> int:
    recipe, _ = parse_recipe_args(argv, prog="train.py", description=__doc__.split("\n")[0])
    try:
        return train(recipe).exit_code
    except PreflightError as exc:
        print(f"train.py: preflight failed, nothing was started:\n{exc}", file=sys.stderr)
        return EXIT_PREFLIGHT


if __name__ == "__main__":
    sys.exit(main())
