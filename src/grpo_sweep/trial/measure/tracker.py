"""Live tensor bytes by category during real GRPO steps, on any device, without a GPU.

WHY our own tracker: PyTorch's `torch.distributed._tools.mem_tracker.MemTracker` breaks under
`trainer.train()` (it hooks frozen LoRA base weights and refuses a module called more than once
per step, which generation does dozens of times) and slows a tiny GRPO step ~20x. This one is a
`TorchDispatchMode` that sees every op's outputs, follows each new *storage* (not tensor: views
share bytes) with a weak reference whose finaliser subtracts its bytes when the allocator frees
it, and so knows the live bytes after every op. Checked against the PyTorch profiler's CPU
allocation events over two real tiny GRPO steps (bench/memtracker_vs_profiler.py): peaks
59,383,304 vs 59,383,328 bytes above the start (24 bytes apart).

Categories (what the bytes are, decided by *how* they are used, not by guessing from shapes):
- `weights`: frozen parameters and buffers of the model (registered when the tracker attaches);
- `trainable_params`: parameters with `requires_grad` (the LoRA adapters);
- `gradients`: a trainable parameter's `.grad` (post-accumulate-grad hooks);
- `optimizer_state`: tensors in `optimizer.state` (global optimiser step post-hook);
- `activations`: tensors autograd saves for backward (a `saved_tensors_hooks` pack hook around
  the loss's forward);
- `temporaries`: everything else - logits tiles, log-softmax, the generation batch, KV cache
  during sampling, activation gradients in backward.
A storage is born a temporary and is re-classed when a hook identifies it; if it was already live
at the recorded peak, the peak's breakdown is corrected too, so the breakdown always sums to the
peak and uses the final, best-known class of every byte.

Phases (`Phases`): `generation` (TRL's `_generate_and_score_completions`: sampling, rewards and
the no-grad scoring pass), `forward` (`compute_loss`), `backward` (`accelerator.backward`),
`optimiser` (gradient clipping and `optimizer.step`), else `other`.

Budget: with `budget_bytes` set, an op whose new storages push live bytes past it raises the real
`torch.OutOfMemoryError` with CUDA's message shape (see enforce.simulated_oom_error); its outputs
are released as the exception unwinds, like a failed CUDA allocation that never happened, and the
peak does not include them.

Overhead: a fixed Python cost per op (~18k ops per tiny-model GRPO step). Measured on this
machine (torch 2.13 CPU, tiny model, default levers, one torch thread, 2 shared cores, 6 steps,
three alternating runs each): 4.3-4.5 s of CPU tracked vs 1.4-2.0 s untracked (~2.6x), and
~3-4x the wall time per step under load; less on bigger models, where each op does more work. Hence
memory_meter.MemoryMeter tracks only the measuring steps (the first two: step 1 creates the optimiser
state, step 2 is the steady state) unless a budget is set or lengths vary, and throughput is taken
from the untracked steps when there are any (see docs/memory.md "Memory: measured and enforced").
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..backends.trl_patches import phase_targets

CATEGORIES = ("weights", "trainable_params", "gradients", "optimizer_state", "activations", "temporaries")
PHASES = ("generation", "forward", "backward", "optimiser", "other")


class Phases:
    """Which part of a GRPO step is running, marked by wrapping the trainer's own methods.

    `listeners` are called with the phase that is *ending* at every transition (the CUDA path
    reads the allocator's peak there to learn in which phase it rose). `failed_in` is the
    innermost phase an exception left, the OOM's phase.
    """

    def __init__(self):
        self.current = "other"
        self.failed_in: str | None = None
        self.listeners: list[Callable[[str], None]] = []
        self._handles: list[Any] = []

    def _switch(self, phase: str) -> str:
        prev = self.current
        for listener in self.listeners:
            listener(prev)
        self.current = phase
        return prev

    def wrap(self, fn: Callable, phase: str) -> Callable:
        @functools.wraps(fn)
        def marked(*args, **kwargs):
            prev = self._switch(phase)
            self.failed_in = None  # an exception swallowed earlier is not this phase's failure
            try:
                return fn(*args, **kwargs)
            except BaseException:
                if self.failed_in is None:
                    self.failed_in = phase
                raise
            finally:
                self._switch(prev)

        return marked

    def attach(self, trainer) -> None:
        """Mark GRPOTrainer's phases (instance attributes shadow the methods; nothing global but
        the optimiser hooks, removed by `detach`)."""
        for owner, name, phase in phase_targets(trainer):
            if callable(getattr(owner, name, None)):  # a trainer version without it: that phase reads `other`
                setattr(owner, name, self.wrap(getattr(owner, name), phase))
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        def pre(optimizer, args, kwargs):
            self._before_step = self._switch("optimiser")

        def post(optimizer, args, kwargs):
            self._switch(getattr(self, "_before_step", "other"))

        self._handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]

    def oom_phase(self) -> str:
        return self.failed_in or self.current

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class _Entry:
    __slots__ = ("born", "category", "nbytes", "ref")

    def __init__(self, nbytes: int, category: str, born: int):
        """One live storage: its bytes, category and when it was born.

        Args:
            nbytes: The storage's bytes.
            category: Its category (CATEGORIES).
            born: The tracker's op counter at its birth (ordered against the peak's).
        """
        self.nbytes, self.category, self.born, self.ref = nbytes, category, born, None


class TensorTracker(TorchDispatchMode):
    """Live storage bytes, their peak, the breakdown and phase at the peak, and an optional budget.

    Use: `tracker.attach(trainer)` (registers weights, trainable parameters, grad and optimiser
    hooks), then `with tracker: trainer.train()`, then `tracker.detach()`.
    """

    def __init__(
        self, budget_bytes: int | None = None, phases: Phases | None = None, oom_error: Callable[..., BaseException] | None = None
    ):
        """A tracker, not yet attached to a trainer.

        Args:
            budget_bytes: The budget it enforces; None: none.
            phases: The phase marks; None: a fresh Phases.
            oom_error: Builds the error for a refused allocation; None: enforce.simulated_oom_error.
        """
        super().__init__()
        self.budget_bytes = budget_bytes
        self.phases = phases or Phases()
        self._oom_error = oom_error
        self.live = 0
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.peak = 0
        self.step_peak = 0  # the peak since the step began (MemoryMeter restarts it at each step's start)
        self.peak_breakdown = dict.fromkeys(CATEGORIES, 0)
        self.peak_phase: str | None = None
        self.category_peaks = dict.fromkeys(CATEGORIES, 0)  # each category's own maximum
        self.oom: dict | None = None  # requested/free/live/phase of the allocation we refused
        self._entries: dict[int, _Entry] = {}
        self._seq = 0  # op counter: orders births against the peak
        self._peak_seq = -1
        self._handles: list[Any] = []

    # --- storage bookkeeping -------------------------------------------------------------------
    def _freed(self, key: int, _ref) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.live -= entry.nbytes
            self.by_category[entry.category] -= entry.nbytes

    def _track(self, tensor: torch.Tensor, category: str = "temporaries") -> int:
        """Register the tensor's storage if new; returns the bytes newly counted."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, meta-less wrappers
            return 0
        key = id(storage)
        entry = self._entries.get(key)
        nbytes = storage.nbytes()
        if entry is not None:
            if entry.nbytes == nbytes:
                return 0
            delta = nbytes - entry.nbytes  # resized in place (`out=` ops)
            entry.nbytes = nbytes
            self.live += delta
            self.by_category[entry.category] += delta
            return max(delta, 0)
        if nbytes == 0:
            return 0
        entry = _Entry(nbytes, category, self._seq)
        entry.ref = weakref.ref(storage, functools.partial(self._freed, key))
        self._entries[key] = entry
        self.live += nbytes
        self.by_category[category] += nbytes
        return nbytes

    def reclassify(self, tensor: torch.Tensor, category: str, only_from: str | None = "temporaries") -> None:
        """Move a storage to `category`; fix the peak's breakdown if it was live at the peak.

        Args:
            tensor: A tensor whose storage is tracked.
            category: The new category.
            only_from: Move it only from this category; None: from any.
        """
        try:
            entry = self._entries.get(id(tensor.untyped_storage()))
        except (RuntimeError, NotImplementedError):
            return
        if entry is None:  # born outside the mode (before it, or after stop()): not ours to class
            return
        if entry.category in (category, "weights", "trainable_params"):
            return
        if only_from is not None and entry.category != only_from:
            return
        self.by_category[entry.category] -= entry.nbytes
        self.by_category[category] += entry.nbytes
        self.category_peaks[category] = max(self.category_peaks[category], self.by_category[category])
        if entry.born <= self._peak_seq:
            self.peak_breakdown[entry.category] -= entry.nbytes
            self.peak_breakdown[category] += entry.nbytes
        entry.category = category

    def _grew(self, new_bytes: int) -> None:
        if self.budget_bytes is not None and self.live > self.budget_bytes:
            before = self.live - new_bytes
            self.oom = {
                "requested_bytes": new_bytes,
                "free_bytes": max(self.budget_bytes - before, 0),
                "live_bytes": before,
                "phase": self.phases.current,
            }
            make = self._oom_error
            if make is None:
                from .enforce import simulated_oom_error as make
            raise make(new_bytes, before, self.budget_bytes, self.phases.current)
        peaks = self.category_peaks
        for category, value in self.by_category.items():
            peaks[category] = max(peaks[category], value)
        if self.live > self.step_peak:
            self.step_peak = self.live
        if self.live > self.peak:
            self.peak = self.live
            self.peak_breakdown = dict(self.by_category)
            self.peak_phase = self.phases.current
            self._peak_seq = self._seq

    # --- the dispatch mode ---------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._seq += 1
        if isinstance(out, torch.Tensor):
            new = self._track(out)
        else:
            new = 0
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    new += self._track(leaf)
        if new:
            try:
                self._grew(new)
            except torch.OutOfMemoryError:
                del out  # the traceback keeps this frame: release the refused bytes now
                raise
        return out

    # --- wiring to a trainer ------------------------------------------------------------------
    def attach(self, trainer) -> None:
        """Register the model's existing storages and install the hooks that class new ones."""
        model = trainer.model
        for param in model.parameters():
            self._track(param, "trainable_params" if param.requires_grad else "weights")
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._grad_ready))
        for buffer in model.buffers():
            self._track(buffer, "weights")
        self.peak = self.live
        self.peak_breakdown = dict(self.by_category)
        self.category_peaks = dict(self.by_category)
        self.peak_phase = self.phases.current
        self.phases.attach(trainer)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles.append(register_optimizer_step_post_hook(self._optimizer_stepped))
        forward = trainer.compute_loss

        @functools.wraps(forward)
        def forward_saving(*args, **kwargs):
            if not getattr(self, "active", False):  # stopped: untracked steps must run at full speed
                return forward(*args, **kwargs)
            self.reregister(model)
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                return forward(*args, **kwargs)

        trainer.compute_loss = forward_saving

    def reregister(self, model) -> None:
        """Class the model's parameters again before each tracked forward: under DDP (a trial of N
        processes) the wrap in `trainer.train()` gives parameters storages born inside the mode,
        which would otherwise count as temporaries (or activations once saved for backward)."""
        for param in model.parameters():
            category = "trainable_params" if param.requires_grad else "weights"
            try:
                entry = self._entries.get(id(param.untyped_storage()))
            except (RuntimeError, NotImplementedError):
                continue
            if entry is None:
                new = self._track(param, category)
                if new:
                    self._grew(new)
            elif entry.category not in ("weights", "trainable_params"):
                self.reclassify(param, category, only_from=None)

    def _pack(self, tensor):
        self.reclassify(tensor, "activations")
        return tensor

    def _grad_ready(self, param) -> None:
        if getattr(self, "active", False) and param.grad is not None:
            self.reclassify(param.grad, "gradients", only_from=None)

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        """After an optimiser step: class the optimiser's tensors as optimizer_state (a torch hook).

        Args:
            optimizer: The optimiser that stepped.
            args: Its step's positional arguments.
            kwargs: Its step's keyword arguments.
        """
        if not getattr(self, "active", False):
            return
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    self.reclassify(value, "optimizer_state", only_from=None)

    # --- stopping early ---------------------------------------------------------------------
    def __enter__(self):
        self.active = True
        return super().__enter__()

    def __exit__(self, *exc):
        if not getattr(self, "active", False):
            return None  # already stopped by stop()
        self.active = False
        return super().__exit__(*exc)

    def stop(self) -> bool:
        """Leave the dispatch mode now (between steps), so later steps run at full speed.

        Only when this mode is the innermost one (nothing else entered since); returns whether it
        stopped. Storages freed later still finalise, but nothing new is counted.
        """
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if getattr(self, "active", False) and _get_current_dispatch_mode() is self:
            self.__exit__(None, None, None)
            return True
        return False

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.phases.detach()

    def result(self) -> dict:
        return {
            "peak_memory_bytes": self.peak,
            "peak_memory_breakdown": dict(self.peak_breakdown),
            "peak_phase": self.peak_phase,
            "category_peaks": dict(self.category_peaks),
        }


def _unpack(tensor):
    return tensor
