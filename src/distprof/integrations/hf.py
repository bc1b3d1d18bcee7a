"""Hugging Face Trainer: ``Trainer(..., callbacks=[DistprofCallback(config)])``.

The Trainer calls its callbacks around every step; this one turns those calls into one distprof
:class:`~distprof.Profiler` per process (and, on request, a second one per gradient-accumulation micro-step).

**Steps.** distprof step N is the optimizer step that takes HF's ``state.global_step`` from N to N+1: the step
that runs while ``state.global_step == N``, which HF logs (``state.log_history``, the ``{'loss': ...}`` lines)
and checkpoints (``checkpoint-{N+1}``) as step N+1. So ``steps: [3]`` captures the update HF logs as step 4,
``steps: [0]`` the first update. This is ms-swift's rule (its callback starts on ``on_step_begin`` when
``state.global_step`` is in its steps) and distprof's own ("the step about to run"): the profiler is created in
``on_train_begin`` with ``global_step=state.global_step`` and stepped in ``on_step_end``, so its counter equals
``state.global_step`` at every callback. A run resumed from ``checkpoint-2`` starts at step 2 and captures the
same steps as a fresh run. ``ProfilerStep#N`` starts where step N-1's ``on_step_end`` returned, so it holds,
in order: the logging, evaluation and checkpointing HF does once ``state.global_step`` is N (the log line and
``checkpoint-N`` of step N-1's update), the fetch of step N's batches, and step N's forward, backward and
optimizer step.

**Gradient accumulation.** With ``gradient_accumulation_steps=k``, the role ``{role}/micro_step`` (say
``main/micro_step``) counts micro-steps: micro-step ``N*k + i`` is the i-th micro-batch (from 0) of optimizer
step N, ended by ``on_substep_end``, the last one by ``on_step_end`` (so it also holds the optimizer step).
When an epoch's last optimizer step has fewer than k micro-batches, the missing numbers are ended empty, so
the numbering stays ``N*k + i`` for every N, across epochs and resumes. This profiler exists when
``micro_steps=True``, or by default when the config's ``roles`` selects it and not ``{role}`` (``roles:
[main/micro_step]``).
torch.profiler traces one window at a time per process, so a config that selects both roles is refused.

**Phases** (:func:`distprof.annotate` ranges, ``user_annotation`` events in the trace), without subclassing
the Trainer: ``train/forward_backward`` per micro-batch, from ``on_step_begin`` / ``on_substep_end`` to the
next ``on_substep_end`` / ``on_pre_optimizer_step`` (the last micro-batch's range also holds gradient
clipping, which HF runs before ``on_pre_optimizer_step``); inside it ``train/forward``, the model's own
``forward`` (a forward pre-hook and hook on the model the Trainer hands its callbacks), then
``train/backward``, from the end of forward to the end of the micro-batch (loss scaling, ``backward``, and
the gradient all-reduce under DDP); ``train/optimizer`` from ``on_pre_optimizer_step`` to
``on_optimizer_step``. Only the first forward of a micro-batch is ``train/forward`` (a forward run again by
activation checkpointing is part of backward). The hooks exist only while a profiler of this process is
enabled; ranges are open only during a capture window.

**Faults.** A disabled config, or a rank / role the config does not select, leaves an inert profiler: no
files, no hooks, one increment per step. A config that does not fit the job (a rank beyond
``args.world_size``, an unwritable ``save_path``) is found in ``on_train_begin`` and, with ``on_error:
disable`` (the default), logged and switches profiling off; with ``on_error: raise`` it is raised. Capture
faults are isolated by the Profiler. A step that raises leaves the Trainer without ``on_train_end``; the
open window is then written when the process exits (see :mod:`distprof.capture.shutdown`), when the same callback
trains again (``auto_find_batch_size`` retries) in the next ``on_train_begin``, or at once by
:meth:`DistprofCallback.close` (a notebook that goes on after ``train()`` raised). Ranges open when the step
raised are ended by torch as the window closes (torch logs a warning naming them).
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("distprof.integrations.hf needs transformers: pip install 'distprof[hf]'") from e

from distprof.capture.annotate import annotate
from distprof.capture.faults import misfit
from distprof.capture.profiler import Profiler
from distprof.config.model import ProfilerConfig
from distprof.config.plan import role_selected
from distprof.rundir.layout import sanitize_role

logger = logging.getLogger(__name__)

__all__ = ["DistprofCallback"]

FORWARD_BACKWARD = "train/forward_backward"
FORWARD = "train/forward"
BACKWARD = "train/backward"
OPTIMIZER = "train/optimizer"

# Where the model's forward stands: outside any micro-batch (optimizer, logging, evaluation), or in a
# micro-batch before its forward, during it, or after it (the rest of the micro-batch is backward).
_IDLE, _BEFORE, _FORWARD, _AFTER = 0, 1, 2, 3


class DistprofCallback(TrainerCallback):
    """Profile a Hugging Face ``Trainer`` with distprof: ``Trainer(..., callbacks=[DistprofCallback(config)])``.

    ``config``: a :class:`~distprof.ProfilerConfig` or a dict (validated here: a bad one raises ``ValueError``).
    ``role``: the role of the per-optimizer-step profiler. ``micro_steps``: also profile micro-steps as
    ``{role}/micro_step`` (None: when ``config.roles`` selects that role and not ``role``). ``phases``: annotate
    forward, backward and optimizer. ``mesh``: the job's DeviceMesh or ``{dim: size}``, for ``ranks: {pp: "*", ...}``.

    Step rule: distprof step N is the optimizer step during which ``state.global_step == N``, which HF logs
    as step N+1; micro-step ``N*k + i`` is its i-th micro-batch. See the module docstring.
    """

    def __init__(self, config: ProfilerConfig | dict | None = None, role: str = "main", *,
                 micro_steps: bool | None = None, phases: bool = True, mesh: Any = None) -> None:
        if config is None:
            config = ProfilerConfig()
        elif not isinstance(config, ProfilerConfig):
            config = ProfilerConfig.from_dict(config)
        self.config = config
        self.role = sanitize_role(role)
        self.micro_role = f"{self.role}/micro_step"
        if micro_steps is None:  # when the config asks for micro-steps by name (roles: None selects every role)
            micro_steps = (config.enable and config.roles is not None and self._captures(self.micro_role)
                           and not self._captures(self.role))
        if micro_steps and config.enable and self._captures(self.role) and self._captures(self.micro_role):
            raise ValueError(f"roles={config.roles!r} selects both {self.role!r} and {self.micro_role!r}, but "
                             f"torch.profiler traces one window at a time per process; set roles: "
                             f"[{self.micro_role}] to profile micro-steps, or pass micro_steps=False")
        self.micro_steps = bool(micro_steps)
        self.phases = phases
        self.mesh = mesh
        self.prof: Profiler | None = None  # per optimizer step
        self.micro: Profiler | None = None  # per micro-step (gradient accumulation)
        self._k = 1  # gradient_accumulation_steps of the run in progress
        self._live = False  # some profiler of this process is enabled: phases are annotated
        self._in_step = False  # between on_step_begin and on_step_end: a stop now interrupts a step
        self._ranges: list[Any] = []  # our open annotate ranges, innermost last
        self._fwd = _IDLE
        self._hooks: list[Any] = []

    def _captures(self, role: str) -> bool:
        cfg = self.config.for_role(role)
        return (cfg.enable or cfg.trigger) and role_selected(self.config.roles, role)

    # ---- the Trainer's events --------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._finish()  # a previous train() that raised (no on_train_end): write its window first
        if not (self.config.enable or self.config.trigger):  # trigger: waits for `distprof trigger` requests
            return
        self._k = k = max(1, int(args.gradient_accumulation_steps))
        prof = self._create(self.role, state.global_step, args)
        micro = self._create(self.micro_role, state.global_step * k, args) if self.micro_steps and prof else None
        if prof is None or (self.micro_steps and micro is None):
            self._finish()
            return
        self.prof, self.micro = prof, micro
        for p in (prof, micro):
            if p is not None:
                p.start()
        self._live = any(p is not None and p.enabled for p in (prof, micro))
        if self._live and self.phases and model is not None:
            self._hooks = [model.register_forward_pre_hook(self._forward_begins),
                           model.register_forward_hook(self._forward_ends)]

    def on_step_begin(self, args, state, control, **kwargs):
        self._in_step = True
        if self._live:
            self._micro_begins()

    def on_substep_end(self, args, state, control, **kwargs):
        if self._live:
            self._close_all()
        if self.micro is not None:
            self.micro.step()
        if self._live:
            self._micro_begins()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self._live:
            self._close_all()
            self._enter(OPTIMIZER)

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self._live:
            self._close_all()

    def on_step_end(self, args, state, control, **kwargs):
        self._in_step = False
        if self._live:
            self._close_all()
        micro = self.micro
        if micro is not None:
            # The last micro-batch ends here; a short last step of an epoch ends its missing numbers empty.
            target = state.global_step * self._k
            micro.step()
            while micro.global_step < target:
                micro.step()
        if self.prof is not None:
            self.prof.step()

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()

    def close(self) -> None:
        """Stop profiling now and write the open window: after a ``train()`` that raised, in a process that goes
        on (HF calls no callback on an exception). Harmless when nothing is open."""
        self._finish()

    # ---- glue ----------------------------------------------------------------------------------------------
    def _create(self, role: str, global_step: int, args: Any) -> Profiler | None:
        try:
            return Profiler(self.config, role=role, global_step=global_step, rank=args.process_index,
                            world_size=args.world_size, mesh=self.mesh, local_rank=args.local_process_index)
        except ValueError as e:  # the config does not fit this job (ranks, save_path): a fault, not a crash
            if misfit(self.config.on_error, e, logger):  # capture/faults.py: logged, or raised with on_error: raise
                raise
            return None

    def _micro_begins(self) -> None:
        self._enter(FORWARD_BACKWARD)
        self._fwd = _BEFORE

    def _forward_begins(self, module: Any, inputs: Any) -> None:
        if self._fwd == _BEFORE:  # the first forward of this micro-batch
            self._fwd = _FORWARD
            self._enter(FORWARD)

    def _forward_ends(self, module: Any, inputs: Any, output: Any) -> None:
        if self._fwd == _FORWARD:
            self._fwd = _AFTER
            self._exit_top()
            self._enter(BACKWARD)

    def _enter(self, name: str) -> None:
        rng = annotate(name)
        rng.__enter__()
        self._ranges.append(rng)

    def _exit_top(self) -> None:
        self._ranges.pop().__exit__(None, None, None)

    def _close_all(self) -> None:
        """Close our open ranges, innermost first (annotate closes ranges as a stack)."""
        while self._ranges:
            self._exit_top()
        self._fwd = _IDLE

    def _finish(self) -> None:
        """Close ranges, remove hooks, stop both profilers (a window still open keeps its finished steps, and the
        step in progress when a step raised)."""
        self._close_all()
        hooks, self._hooks = self._hooks, []
        for h in hooks:
            h.remove()
        self._live = False
        interrupted, self._in_step = self._in_step, False
        micro, prof, self.micro, self.prof = self.micro, self.prof, None, None
        for p in (micro, prof):
            if p is None:
                continue
            if interrupted:  # a step raised: it ran in part, keep what it recorded (manifest: stopped_by exception)
                p.__exit__(RuntimeError, None, None)
            else:
                p.stop()
