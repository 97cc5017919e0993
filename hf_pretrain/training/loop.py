"""The training loop: `setup` builds the parts of a run, `train` steps them until a guard says stop.

Each part decides its own timing from the step: the logger writes a record every `log_interval`
steps, the evaluation runs every `eval_interval`, the checkpointer saves every `save_interval`, and
the guards (guards.py) decide, together on every process, when the run ends. Side jobs (publishing,
benchmarks) hang off the saved checkpoints as callbacks and never hold the loop up.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed

from hf_pretrain.checkpoints.checkpointer import Checkpointer, CheckpointSaveError
from hf_pretrain.checkpoints.load import restore_continuation
from hf_pretrain.checkpoints.progress import Activity
from hf_pretrain.checkpoints.resume_decision import decide_resume
from hf_pretrain.checkpoints.resume_plan import Continuation
from hf_pretrain.checkpoints.store import remove_pins
from hf_pretrain.config import ComputeConfig, ModelConfig, OptimConfig, Recipe, TrainConfig, math_keys, save_recipe
from hf_pretrain.data.loader import TrainData
from hf_pretrain.data.prepared import data_identity, prepare_hint, read_meta
from hf_pretrain.data.tokenizer import load_data_tokenizer
from hf_pretrain.economics.memory import CHECKPOINT_BYTES_PER_PARAMETER
from hf_pretrain.economics.resolved_run import ResolvedRun
from hf_pretrain.exit_codes import EXIT_SAVE_FAILED
from hf_pretrain.faults import hold_if_asked
from hf_pretrain.machine.hardware import describe_hardware
from hf_pretrain.machine.run_profile import RunProfile, device_kind, this_machine
from hf_pretrain.model.fp8 import finish_fp8
from hf_pretrain.model.initialisation import init_weights, model_config
from hf_pretrain.model.llama import (
    apply_liger,
    build_model,
    count_parameters,
    enable_activation_checkpointing,
    flops_per_token,
    train_in_compute_dtype,
)
from hf_pretrain.model.loss import loss_head_for, use_loss_head
from hf_pretrain.optim.build import Schedule, build_optimizer
from hf_pretrain.preflight.checks import preflight
from hf_pretrain.run_folder.run_dir import RunDir, set_activity, truncate_jsonl
from hf_pretrain.run_folder.sessions import start_up
from hf_pretrain.store.location import Location, Where
from hf_pretrain.training.accelerator import accelerator_for
from hf_pretrain.training.callbacks import Callback, CallbackList
from hf_pretrain.training.compile_cache import CompileCache, key_fields
from hf_pretrain.training.guards import Guards, Stop, take_up_at_start
from hf_pretrain.training.metrics import RunEconomics, RunLogger, flat_config
from hf_pretrain.training.rendezvous import attempt_store, hold_the_group
from hf_pretrain.training.state import TrainState
from hf_pretrain.training.step import Evaluation, TrainStep
from hf_pretrain.training.step_attempt import StepAttempt
from hf_pretrain.training.watchdog import Watchdog, process_group_kwargs


@dataclass
class Outcome:
    """How a call to `train` ended: the process exit code, a line for the user, the final model, and
    whether the schedule was run to its end (rather than stopped on the way, to go on later)."""

    exit_code: int
    message: str
    final_model: Path | None = None
    finished: bool = False


def train(recipe: Recipe, callbacks: Sequence[Callback] = (), *, where: Where) -> Outcome:
    """Run the recipe to `max_steps`, resuming when asked; one iteration is one optimizer step.

    Stops early, always with a checkpoint, on `stop_at_step`, on SIGTERM/SIGINT, or after
    `max_bad_steps` non-finite steps in a row; a checkpoint that cannot be written stops it too.
    `hf-pretrain stop` and early stopping finish it early: a wsd run decays first (guards.py).
    """
    run = setup(recipe, where)
    state, log = run.state, run.log
    side_jobs = CallbackList(callbacks if run.accelerator.is_main_process else [])  # nobody waits for them
    stop = Stop(0, finished=True) if state.step >= state.end else None
    checkpoint = None
    with (
        Guards(
            recipe.stopping, recipe.reporting, output_dir=recipe.train.output_dir, accelerator=run.accelerator, log=log
        ) as guards,
        Watchdog(recipe.stopping.hang_timeout_s, run.accelerator, run.dir) as watchdog,
    ):
        state.start_clock()
        attempt = StepAttempt(run.train_step, state.hardware)  # a failed data read stops it; sessions.jsonl
        while stop is None:
            hold_if_asked(state.step + 1, run.accelerator.process_index, log.say)  # tests only (faults.py)
            result, stop = attempt(state.step + 1)
            if result is not None:
                state.advance(recipe.train.global_batch_tokens, skipped=not result.finite)
                watchdog.beat(state.step)  # no progress for hang_timeout_s: the run is hung (watchdog.py)
                healthy = guards.check(state.step, result)  # a non-finite step was skipped, weights untouched
                log.step(state, result)
                if run.compile_cache.due():  # the compiled code, for the next session (compile_cache.py)
                    with log.paused():
                        run.compile_cache.save(state.step)
                if healthy and run.evaluation.due(state):
                    with log.paused(), watchdog.paused("an evaluation"):
                        val_loss, samples = run.evaluation()
                    log.evaluation(state, val_loss, samples)
                    guards.observe_val_loss(val_loss)
                # the step's one exchange between processes; a side job may halt the run (a store lease lost)
                stop = guards.decide(state, log.history, halt=side_jobs.halt())
                if stop is None and run.data.mixture_changes(decay_position(state)):  # a cooldown began
                    run.train_step.batches = iter(run.data.loader(state.step, state.data_origin, decay_position(state)))
            # every stop saves (unless its folder is gone: nowhere to save), else the checkpointer's interval
            saving = stop.saves if stop is not None else run.checkpoints.due(state)
            if saving:
                try:
                    with log.paused(), watchdog.paused("a checkpoint save"):
                        # a periodic save seals in the background, the last one before it returns
                        checkpoint = run.checkpoints.save(
                            state.state_dict() | log.state_dict(),
                            last=stop is not None,
                            then=side_jobs.on_checkpoint_saved,
                        )
                except CheckpointSaveError as exc:
                    stop = Stop(EXIT_SAVE_FAILED, f"stopped: {exc}")
                    break
        watchdog.stop()
        log.close()
        # a URL run's checkpoint named under its URL (uploaded on the way out), not the cache's copy
        checkpoint = run.dir.show(checkpoint) if checkpoint is not None else None
        if stop.reason:
            log.say(stop.message(checkpoint), every_process=stop.exit_code != 0)
        if stop.finished:
            side_jobs.on_train_end(run.dir)
        side_jobs.wait()  # inside the guards: a second signal still ends the wait at once
    run.accelerator.end_training()
    # a diverged loss is a warning on the model, not a failure of the job: said here, so status.json has it too
    diverged = f" | warning: {log.divergence.verdict}" if log.divergence.verdict else ""
    diverged += f" | warning: {log.slow_node}" if log.slow_node else ""  # a likely slow or faulty GPU, too
    if not stop.finished:
        return Outcome(stop.exit_code, stop.message(checkpoint) + diverged)
    return done(run, state, diverged)


def done(run: Run, state: TrainState, warnings: str) -> Outcome:
    """The outcome of a run that finished its schedule, said in its last line (with `warnings`)."""
    final = run.dir.final if run.dir.final.is_dir() else None
    message = (
        f"done: {state.step} steps, {state.tokens_seen:,} tokens in {state.elapsed():.0f}s | "
        f"metrics {run.dir.show(run.dir.metrics)} | samples {run.dir.show(run.dir.samples)}"
        + (f" | model {run.dir.show(final)}" if final else "")
        + warnings
    )
    run.log.say(message)
    return Outcome(0, message, final, finished=True)


def decay_position(state: TrainState) -> int | None:
    """The first sample position of the final decay or cooldown (its data mixture starts there)."""
    return None if state.decay_start is None else state.data_position(state.decay_start)


@dataclass
class Run:
    """The parts of a run, ready for its first step."""

    accelerator: Accelerator
    dir: RunDir
    state: TrainState
    train_step: TrainStep
    evaluation: Evaluation
    checkpoints: Checkpointer
    log: RunLogger
    data: TrainData
    compile_cache: CompileCache


def take_the_folder(recipe: Recipe, run_dir: RunDir, continuation: Continuation, state: TrainState, say) -> None:
    """The run folder made this session's (main process): the recipe as run, an old ending set aside when
    going further, a stop request from before this start taken up, the records after the checkpoint cut."""
    run_dir.path.mkdir(parents=True, exist_ok=True)
    if run_dir.shown_as() != str(run_dir.path):  # a run URL's working copy: the recipe names the URL, as typed
        recipe = recipe.replace(output_dir=run_dir.shown_as())
    save_recipe(recipe, run_dir.resolved_recipe)
    for note in continuation.set_aside(run_dir):  # going further: the old ending stays, out of the way
        say(note)
    # a stop request from before this start: applied at the first step, unless this start is a new plan
    take_up_at_start(run_dir.path, continuation.max_steps_changed, state.cooldown, say)
    # a resumed run rewrites the steps after its checkpoint, so the files hold one clean curve
    for records in (run_dir.metrics, run_dir.samples, run_dir.benchmarks):
        truncate_jsonl(records, after_step=state.step)
    remove_pins(run_dir.path)  # held by side jobs of a session that was killed


def model_and_optimizer(
    model_section: ModelConfig,
    compute: ComputeConfig,
    optim: OptimConfig,
    profile: RunProfile,
    config,
    accelerator: Accelerator,
    starts: bool,
):
    """The model `config` describes (init_from's weights for a run that `starts`; a resumed one loads its
    checkpoint) as `profile`'s step runs it (kernels, checkpointed layers, Liger, FP8), and the optimizer,
    prepared; and the model's parameter count."""
    if profile.attention_why:  # `auto` became what a check measured fastest here
        accelerator.print(profile.attention_why)
    model = build_model(config, attention_backend=profile.step.attention_backend)
    if starts:
        init_weights(model, model_section.init_from, log=accelerator.print)
    n_params = count_parameters(model)
    if profile.step.checkpointed_layers:  # checkpointed_layers, or all of them with gradient_checkpointing
        enable_activation_checkpointing(model, profile.step.checkpointed_layers)
    if compute.liger and not profile.step.liger:
        accelerator.print("liger: CUDA is not available, training with the standard kernels")
    liger_applied = profile.step.liger and apply_liger(model, log=accelerator.print)
    use_loss_head(model, loss_head_for(compute, liger_applied))  # Liger's, chunked or stock (loss.py)
    train_in_compute_dtype(model)  # residual stream in the autocast dtype, the loss alone out of the graph
    optimizer = build_optimizer(model, optim, fused=profile.machine.on_gpu)
    model, optimizer = accelerator.prepare(model, optimizer)
    if converted := finish_fp8(model, profile.step):  # fp8: the CPU's emulation takes a GPU's dtypes
        accelerator.print(converted)
    return model, optimizer, n_params


def checked_start(recipe: Recipe, resolved: ResolvedRun, run_dir: RunDir) -> tuple[Continuation, Activity]:
    """The preflight's verdict, then which checkpoint the run goes on from: decided once, checksums and
    all (a live line while they are read, and status.json's `activity` on the main process); the
    preflight's table shows that decision. Raises what the preflight or the decision refuses."""
    main = PartialState().is_main_process
    activity = functools.partial(set_activity, run_dir.path) if main else None
    say = (lambda line: print(run_dir.in_words(line))) if main else None  # a URL run: its URL, not the cache
    decide = functools.cache(
        lambda: decide_resume(recipe, data_identity(resolved.where.data), say=say, activity=activity)
    )
    preflight(recipe, resolved, log=say or (lambda _: None), resume_decision=decide)
    return decide(), activity


def resumed_state(
    recipe: Recipe, accelerator: Accelerator, continuation: Continuation, run_dir: RunDir, data: Location
) -> tuple[TrainState, dict | None]:
    """The run's progress, and the checkpoint's train state it came from (None for a start at step 0):
    weights, optimizer and RNG restored from the checkpoint the continuation names (the newest, or the
    last one before the decay of a run that goes further); the data position is the step. The main
    process takes the folder only now, resumed or started: a refused run leaves it as it was."""
    say = lambda line: accelerator.print(run_dir.in_words(line))  # noqa: E731 (a URL run: its URL, not the cache)
    hardware = describe_hardware(accelerator.device, accelerator.num_processes)
    state = TrainState.at_start(
        hardware,
        fingerprint=recipe.fingerprint(),
        math=math_keys(recipe),
        schedule=Schedule(recipe.optim, max_steps=recipe.train.max_steps),
        samples_per_step=recipe.train.global_batch_tokens // recipe.data.seq_len,
        data=data,  # where the data lives (the door's)
    )
    for reason in continuation.skipped:
        say(f"resume: skipping {reason}")
    with start_up.timed("checkpoint"):  # sessions.jsonl: what the start-up went to
        saved = restore_continuation(accelerator, continuation.folder, log=say)
    if saved:
        state.load_state_dict(saved)
        for note in state.go_on_as(continuation, saved):
            say(note)
        say(f"resumed from {continuation.folder} at step {state.step}")
    elif recipe.checkpoints.resume == "auto":
        say(f"resume: no complete checkpoint in {run_dir.checkpoints}, starting from step 0")
    if accelerator.is_main_process:
        take_the_folder(recipe, run_dir, continuation, state, say)
    return state, saved


def start_processes(hang_timeout_s: float, *, on_cpu: bool) -> tuple[int, dict]:
    """Join this process to the job's process group: the world size, and the group's timeout (collectives
    give up just after the watchdog reports) for the Accelerator. Without CUDA the processes must run on the
    CPU (`on_cpu`); saying so up front is what makes Accelerate join processes started by torchrun
    (`accelerate launch --multi_gpu`) into a gloo group."""
    group = process_group_kwargs(hang_timeout_s)
    # this call creates the process group, its keys apart from those of an attempt before a restart
    processes = PartialState(cpu=on_cpu, **group, **attempt_store(group.get("timeout")))
    hold_the_group()  # ended after the model, from Python: train.py's `group_ends_last` (rendezvous.py)
    hold_if_asked(0, processes.process_index, print)  # tests only: `hold:0` holds the start-up (faults.py)
    return processes.num_processes, group


def introduction(
    train: TrainConfig,
    seq_len: int,
    notes: list[str],
    n_params: int,
    grad_accum: int,
    profile: RunProfile,
    state: TrainState,
) -> str:
    """The lines a run starts with: the model, the batch, the precision, the schedule; the recipe's `notes`."""
    lines = [
        f"model: {n_params / 1e6:.2f}M parameters | {profile.step.world_size} process(es) x {grad_accum} "
        f"micro-batches of {train.micro_batch_size} x {seq_len} tokens = {train.global_batch_tokens:,} tokens/step | "
        f"precision {profile.precision}\nschedule: {state.schedule.describe()}",
        *notes,
    ]
    return "\n".join(lines)


def loaders(data: TrainData, state: TrainState, eval_tokens: int):
    """The training batches from `state`'s step, and the validation batches: a data_dir URL's validation
    blocks fetched now (data/loader.py), so that no evaluation waits on the store; timed for sessions.jsonl."""
    with start_up.timed("data"):
        return data.loader(state.step, state.data_origin, decay_position(state)), data.val_loader(eval_tokens)


def setup(recipe: Recipe, where: Where) -> Run:
    """Build a run, the cheap checks first (the preflight), then the Accelerator, model and optimizer, the
    resumed state, the data. `where`: where the run (a local folder by now) and the data live."""
    cfg = recipe.train
    run_dir = RunDir(cfg.output_dir)
    # the door asks which device: CPU or CUDA for the process group, then the machine (a rank's own GPU) once
    world_size, group = start_processes(recipe.stopping.hang_timeout_s, on_cpu=device_kind() != "cuda")
    resolved = ResolvedRun.at_door(recipe, this_machine(), where, world_size)  # handed down, never worked out again
    profile = resolved.profile
    continuation, activity = checked_start(recipe, resolved, run_dir)
    grad_accum = recipe.grad_accum_steps(world_size)  # after the preflight, which refuses a batch that does not split
    tokenizer = load_data_tokenizer(where.data)
    accelerator = accelerator_for(profile, recipe.compute, grad_accum, recipe.reporting.report_to, group, run_dir.path)
    set_seed(cfg.seed)
    config = model_config(recipe.model, tokenizer, continuation.folder)  # the model section's Llama, or init_from's
    model, optimizer, n_params = model_and_optimizer(
        recipe.model, recipe.compute, recipe.optim, profile, config, accelerator, continuation.folder is None
    )
    state, saved = resumed_state(recipe, accelerator, continuation, run_dir, where.data)
    key = key_fields(profile, config, recipe.data.seq_len)  # what compiled code of an earlier session must match
    compile_cache = CompileCache.loaded(run_dir, key, recipe.compute, accelerator)  # before the first step compiles
    data = TrainData(
        recipe.data,
        where.data,
        meta=read_meta(where.data, fix=prepare_hint(recipe)),
        rank=accelerator.process_index,
        world_size=world_size,
        grad_accum=grad_accum,
        micro_batch_size=cfg.micro_batch_size,
        seed=cfg.seed,
        pin_memory=profile.machine.on_gpu,
    )
    train_loader, val_loader = loaders(data, state, recipe.evaluation.eval_tokens)
    accelerator.print(introduction(cfg, recipe.data.seq_len, recipe.notes(), n_params, grad_accum, profile, state))
    log = RunLogger(
        recipe.reporting,
        accelerator=accelerator,
        run=run_dir,
        state=state,
        flops_per_token=flops_per_token(config, n_params, recipe.data.seq_len),
        global_batch_tokens=cfg.global_batch_tokens,
        compiled=recipe.compute.compile,  # what compiling cost goes into the records
        phases=recipe.run_phases,  # a phase table when one ends
        tracker_config=flat_config(recipe),  # the trackers are shown the whole recipe
        # cost, the slow-node check, `plan`'s measurement: the run's own step on its card (the door's profile)
        economics=RunEconomics(resolved, cfg, recipe.reporting),
        epochs_after=data.epochs_after,
        source_tokens=data.source_tokens,
    )
    log.load_state_dict(saved)
    return Run(
        accelerator,
        run_dir,
        state,
        TrainStep(accelerator, model, optimizer, train_loader, recipe.optim, grad_accum, lr_of=state.lr),
        Evaluation(accelerator, model, val_loader, tokenizer, recipe.evaluation),
        Checkpointer(
            recipe.checkpoints,
            accelerator=accelerator,
            output_dir=recipe.train.output_dir,
            model_config=config,
            tokenizer=tokenizer,
            log=accelerator.print,
            expected_bytes=CHECKPOINT_BYTES_PER_PARAMETER * n_params,
            activity=activity,
        ),
        log,
        data,
        compile_cache,
    )
