"""The child-process side of a trial: build the trainer, run N real GRPO steps, write metrics.json.

Runs in its own process (trial/parent.py starts it) so that an OOM, a crash or a hang cannot take the sweep
with it, and so that all GPU memory is returned to the driver when it exits.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from ..config import backends
from ..config.local import installed
from ..config.split import generation_batch_size, processes_of
from ..levers import recipe_of, requested_levers
from ..memory.estimator import estimate, generates_with_vllm
from ..memory.throughput import relative_step_time, speed_record
from ..metrics import PRESCREEN_KEYS, empty_metrics, versions, write_metrics
from ..study.attrs import Status
from .faults import fault_callbacks, hang_after_training, inject_fault, perturb_callbacks
from .process import end_now, own_process, quiet_progress, set_alloc_conf
from .stopping import TrialStopped, print_failure

WANDB_NOTE_FILE = "WANDB_RUN_NOT_FINISHED.txt"  # written by the parent when the W&B run was left open


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, the CPU allocator's failure, and vLLM's start-up memory errors."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    needles = (
        "out of memory",
        "can't allocate memory",
        "No available memory for the cache blocks",
        "larger than the available KV cache memory",
        "less than desired GPU memory utilization",
    )
    return isinstance(exc, (RuntimeError, ValueError, MemoryError)) and any(n in text for n in needles)


def main(
    container: dict,
    run_dir: str,
    lifeline=None,
    grace_s: float = 20.0,
    *,
    as_rank: bool = False,
    environ: dict | None = None,
    stdio: tuple[int, int] | None = None,
) -> None:
    """Entry point in the child. Always leaves metrics.json unless killed from outside.

    With trial.num_processes > 1 this process leads the trial: it launches the ranks under torchrun
    (trial/ranks.py) and merges their records; each rank runs this function again with `as_rank`
    (trial/rank.py), in its own directory, as a one-process trial's body.

    Args:
        container: The composed train config, as a plain dict.
        run_dir: The trial's folder.
        lifeline: The read end of the parent's pipe, or None.
        grace_s: Seconds the worker gets to stop when the parent is gone.
        as_rank: This process is a rank of a multi-process trial.
        environ: The parent's environment, or None.
        stdio: The parent's stdout and stderr descriptors, or None.
    """
    run_path = own_process(run_dir, lifeline, grace_s, as_rank=as_rank, environ=environ, stdio=stdio)
    cfg = OmegaConf.create(container)
    record = empty_metrics(Status.FAILED, None, requested_levers(cfg), recipe_of(cfg))
    record["cuda_alloc_conf"] = set_alloc_conf(cfg.get("expandable_segments", False))
    if processes_of(cfg) > 1 and not as_rank:
        from .ranks import lead

        quiet_progress()  # the leader may build the ranks' checkpoint (ranks.prepare_checkpoint)
        lead(cfg, run_path, record, grace_s)  # always writes metrics.json
        sys.stdout.flush()
        sys.stderr.flush()
        return
    with TrialRun(cfg, run_path, record, as_rank=as_rank) as run:
        run.setup()
        run.train()
    if not as_rank and mp.parent_process() is not None:
        end_now()


class TrialRun:
    """One trial's body in this process: `setup` (the backend, the meters, the task, the trainer),
    `train` (N real GRPO steps under the meters), then, as the context manager exits, `finish`.

    The context manager always writes metrics.json: a TrialStopped is its status and reason, any
    other exception `oom` (its numbers parsed) or `failed`, printed (stopping.print_failure); the exception
    is not raised further (the record is the trial's answer). The frames of a failed step are
    cleared before the record is finished: they hold its tensors."""

    def __init__(self, cfg: Any, run_path: Path, record: dict, *, as_rank: bool) -> None:
        """A trial's run, set up by `setup` and closed by `finish`.

        Args:
            cfg: The trial's composed config.
            run_path: Its run directory.
            record: metrics.json so far (`metrics.empty_metrics`), completed here.
            as_rank: One rank of trial.num_processes > 1 (the leader merges the ranks' records and
                writes world_size, strategy and the ranks' peaks).
        """
        self.cfg, self.run_path, self.record, self.as_rank = cfg, run_path, record, as_rank
        # What setup built so far; finish reads whichever exist when a step fails.
        self.wb: Any = None  # this trial's W&B run (wandb_logger.py); a no-op logger unless logger=wandb
        self.meter: Any = None  # speed_meter.StepMeter: step times, history, early stop
        self.reward_clock: Any = None  # tasks/rewards.RewardClock: seconds in reward functions per step
        self.memory: Any = None  # memory_meter.MemoryMeter: budget, tracker/allocator peaks, OOM numbers
        self.backend: Any = None
        self.trainer: Any = None

    def setup(self) -> None:
        """Everything up to the first step; the torch side is imported here, in the child."""
        import torch

        from .backends import get_backend, prepare_imports

        cfg, record = self.cfg, self.record
        on_cuda = torch.cuda.is_available()
        if not on_cuda and cfg.trial.get("cpu_threads"):
            torch.set_num_threads(int(cfg.trial.cpu_threads))  # trial.cpu_threads (schema.TrialConfig)
        backend_name = backends.resolve(cfg.backend.name, cuda=on_cuda, installed=installed)
        prepare_imports(backend_name, cfg)  # Unsloth first, before anything imports transformers/TRL
        quiet_progress()
        # Each of these may import transformers or TRL: only after prepare_imports.
        from .measure.memory_meter import MemoryMeter
        from .measure.speed_meter import StepMeter
        from .models import load_tokenizer
        from .tasks import get_task
        from .tasks.rewards import RewardClock
        from .wandb_logger import open_logger  # imports wandb only when logger=wandb

        record.update(device="cuda" if on_cuda else "cpu", backend=backend_name, versions=versions())
        print(f"[trial] backend={backend_name} device={record['device']} model={cfg.model.name}", flush=True)
        record.update(_prediction(cfg, record["device"], backend_name))
        prescreen = cfg.trial.get("prescreen")  # the sweeper's pre-screen (raw, calibrated, correction)
        if prescreen:
            record.update({key: prescreen[key] for key in PRESCREEN_KEYS if key in prescreen})
        self.backend = get_backend(backend_name)
        # vLLM's pool shares the training card in colocate mode only (server mode: its own devices); Unsloth
        # with backend.fast_inference=false generates with HF, no pool
        colocated = generates_with_vllm(cfg, backend_name) and cfg.backend.get("vllm_mode", "colocate") != "server"
        self.memory = MemoryMeter(cfg, on_cuda, vllm=colocated)  # caps CUDA before the model loads
        task = get_task(cfg)
        tokenizer = load_tokenizer(cfg, task.corpus())
        self.wb = open_logger(cfg, self.run_path, record)  # before the model loads: an OOM at load is logged too
        dataset = task.dataset(tokenizer)
        record["prompt_lengths"] = task.prompt_lengths
        _say_cut_prompts(task.prompt_lengths or {})
        self.reward_clock = RewardClock()
        reward_funcs = task.rewards(self.reward_clock)  # the user's are imported here: a bad one fails before the model loads
        self.meter = StepMeter(
            cfg.trial.steps,
            generation_batch_size(cfg),
            memory_probe=self.memory.probe,
            tracking=self.memory.tracking,
            stop_below=cfg.trial.get("stop_below"),  # set by the sweeper (hydra.sweeper.stop_below)
            first_timed_step=(self.memory.track_steps or 1) + 1,  # past the tracker's measuring steps
            step_probe=self.memory.step_peak if self.memory.per_step else None,  # trial.soak
        )
        ctx = SimpleNamespace(
            tokenizer=tokenizer,
            dataset=dataset,
            reward_funcs=reward_funcs,
            callbacks=[
                self.meter,
                self.memory.callback(),
                self.reward_clock,
                *fault_callbacks(cfg.trial.debug_fault),
                *perturb_callbacks(cfg.trial.get("debug_perturb"), cfg.seed),
            ],
            run_dir=self.run_path,
            on_cuda=on_cuda,
        )
        self.trainer = self.backend.build_trainer(cfg, ctx)
        self.meter.on_step = self.wb.log_step  # each step's row to W&B too
        self._read_back(backend_name, tokenizer, dataset)

    def _read_back(self, backend_name: str, tokenizer: Any, dataset: Any) -> None:
        """What the built trainer really does: the effective levers and lengths, the settings the
        export writes, the levers the backend changed, the trainable parameters, the warm-up.

        Args:
            backend_name: The resolved backend.
            tokenizer: The trial's tokenizer.
            dataset: The trial's dataset.
        """
        from .backends import trl as trl_backend
        from .backends.readback import format_mismatch, lever_mismatch
        from .models import warmup_record
        from .tasks.base import prompt_tokens as count_tokens

        cfg, record, backend, trainer = self.cfg, self.record, self.backend, self.trainer
        prompt_tokens = max(count_tokens(tokenizer, p) for p in dataset["prompt"])
        effective = backend.effective(trainer)
        effective["max_prompt_tokens"] = prompt_tokens
        effective["max_seq_length"] = prompt_tokens + effective["max_completion_length"]
        record["effective"] = effective
        if self.as_rank and effective.get("strategy") != cfg.trial.strategy:  # never credit one strategy's numbers to another
            raise RuntimeError(
                f"trial.strategy={cfg.trial.strategy} did not take effect: accelerate distributes this trainer "
                f"as {effective.get('strategy')} (see docs/multi-gpu.md)"
            )
        # What the export (report/export.py) writes for TRL / Unsloth: read back from the built trainer.
        try:  # never fails the trial: without it the trial only cannot be exported (report/export.py says so)
            record["trainer_settings"] = getattr(backend, "settings", trl_backend.settings)(trainer, cfg, effective)
        except Exception as exc:  # noqa: BLE001
            print(f"[trial] trainer settings for the export not read: {type(exc).__name__}: {exc}", flush=True)
        record["vllm_pool_bytes"] = effective.get("vllm_pool_bytes")  # vLLM's up-front pool, when in process
        self.memory.charge_pool(record["vllm_pool_bytes"])  # CPU: the card holds it beside training
        record["lever_mismatch"] = lever_mismatch(record["levers"], effective, worst_case_lengths=cfg.trial.worst_case_lengths)
        if record["lever_mismatch"]:
            print(
                f"[trial] WARNING levers changed by {backend_name}: {format_mismatch(record['lever_mismatch'])}"
                " (metrics.json lever_mismatch; throughput is for the effective values)",
                flush=True,
            )
        record["trainable_params"] = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        record["warmup"] = warmup_record(cfg, tokenizer)  # model.init=warm: the warm-up's steps, loss, seconds

    def train(self) -> None:
        """The trial.steps real GRPO steps under the meters; `slow` when early stop ended them."""
        inject_fault(self.cfg.trial.debug_fault)
        self.memory.attach(self.trainer)
        with self.memory.running():
            self.trainer.train()
        if hasattr(self.backend, "after_train"):  # trl_vllm: the weight-sync check (can fail the trial)
            self.backend.after_train(self.trainer, self.record)
        self.record.update(status=Status.SLOW if self.meter.stopped else Status.OK, error=self.meter.stopped)
        logged, asked = len(self.meter.rows), int(self.cfg.trial.steps)
        if not self.meter.stopped and logged < asked:  # its throughput would come from the steps that did log
            self.record.update(
                status=Status.FAILED,
                error=f"logged {logged} of trial.steps={asked} optimiser steps: the trainer ended or logged fewer "
                "steps than asked, so its throughput and peak do not cover the run",
            )
        elif not self.meter.stopped and (why := self.meter.unmeasured()):
            self.record.update(status=Status.FAILED, error=why)
        hang_after_training(self.cfg.trial.debug_fault, self.record["status"])

    def __enter__(self) -> TrialRun:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        oom_text = None
        if isinstance(exc, TrialStopped):  # the parent's timeout, an interrupted sweep, or the parent died
            self.record.update(status=exc.status, error=exc.reason)
            print(f"[trial] stopped: {exc.reason}", flush=True)
        elif exc is not None:  # everything must end in metrics.json
            oom = is_oom(exc)
            oom_text = str(exc) if oom else None  # the text, not the exception: its frames hold tensors
            self.record.update(status=Status.OOM if oom else Status.FAILED, error=f"{type(exc).__name__}: {exc}")
            if not oom:
                print_failure(exc)
        if tb is not None:
            traceback.clear_frames(tb)
        del exc, tb
        self.finish(oom_text)
        return True

    def finish(self, oom_text: str | None) -> None:
        """Complete the record with what the meters measured (oom_text: the OOM's message, parsed
        for its numbers), write metrics.json, then finish the W&B run and write it again."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop now waits for metrics.json and W&B
        record = self.record
        if "grpo_sweep.trial.vllm_server" in sys.modules:  # backend.vllm_mode=server: stop it, whatever happened
            from .vllm_server import stop_all

            record.update(stop_all())
        if not self.as_rank:  # a one-process trial (ranks.merge writes these for N processes)
            record.update(world_size=1, strategy=None)
        if self.meter is not None:
            record.update(self.meter.summary())
            record.update(history=self.meter.rows, first_step_begin_unix=self.meter.first_step_begin_unix)
        if self.meter is not None:
            record.update(_speed(self.cfg, record))
        if self.reward_clock is not None:
            record["reward_seconds_per_step"] = self.reward_clock.seconds_per_step()
        if self.memory is not None:
            record.update(self.memory.result(oom_text))
            if not self.as_rank:
                record["rank_peak_memory_bytes"] = [record.get("peak_memory_bytes")]
        write_metrics(self.run_path, record)
        if self.wb is not None and record.get("wandb_run_id"):
            record["wandb_finished"] = self.wb.finish(record)  # after metrics.json: a slow upload never costs the result
            write_metrics(self.run_path, record)
        sys.stdout.flush()
        sys.stderr.flush()


def _prediction(cfg: Any, device: str, backend_name: str) -> dict:
    """The estimator's prediction, to stand beside the measured peak; never fails the trial.

    Args:
        cfg: The composed train config.
        device: "cpu" or "cuda".
        backend_name: The resolved backend.

    Returns:
        The prediction's numbers, or why there is none.
    """
    try:
        predicted = estimate(cfg, device=device, backend=backend_name)
    except Exception as exc:  # noqa: BLE001
        print(f"[trial] memory estimate failed: {type(exc).__name__}: {exc}", flush=True)
        return {"predicted_peak_bytes": None}
    return {
        "predicted_peak_bytes": predicted.total_bytes,
        "predicted_peak_breakdown": predicted.components,
        "logits_mode": predicted.assumptions["logits_mode"],
        "logits_mode_trl_version": predicted.assumptions["logits_mode_trl_version"],
        "predicted_generation_waves": predicted.assumptions.get("generation_waves"),
    }


def _speed(cfg: Any, record: dict) -> dict:
    """The trial's speed against its card's limit (throughput.speed_record); never fails the trial."""
    try:
        model = relative_step_time(cfg, record.get("logits_mode"))
    except Exception as exc:  # noqa: BLE001  (a card without datasheet speeds: ConfigError)
        return speed_record(record, None, f"{type(exc).__name__}: {exc}")
    return speed_record(record, model)


def _say_cut_prompts(lengths: dict) -> None:
    """One line when prompts were cut to max_prompt_length: TRL does not cut them, so the export differs."""
    if lengths.get("cut"):
        print(
            f"[trial] {lengths['cut']} of {lengths['count']} prompts are longer than max_prompt_length="
            f"{lengths['max_prompt_length']} tokens (the longest {lengths['max']}): cut to it here; TRL does not cut "
            "them, so `trl grpo` on this data trains longer steps than these (the export says so)",
            flush=True,
        )
