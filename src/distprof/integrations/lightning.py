"""PyTorch Lightning: ``Trainer(profiler=DistprofProfiler(config))``.

Lightning drives a profiler through ``setup(stage)``, ``start(action)`` / ``stop(action)`` around each of its
actions, ``describe()`` (which calls ``summary()`` then ``teardown()``) at the end of a successful run. This
class turns those calls into one distprof :class:`~distprof.Profiler` per process and stage.

**Steps.** In ``trainer.fit``, distprof step N is Lightning's optimizer step N: the batches whose
``training_step`` sees ``self.global_step == N``. With ``accumulate_grad_batches=k`` that is k consecutive
batches, the last of which steps the optimizer (an epoch whose length is not a multiple of k steps on its last
batch, as Lightning does). ``ProfilerStep#N`` ends when ``run_training_batch`` returns with
``trainer.global_step`` advanced past N; it starts where step N-1 ended, so after step N-1's own batches it
holds step N-1's ``on_train_batch_end`` hooks, logging, any validation run and checkpoint save, then step N's
data fetch, batch transfer and batches. One distprof step per increment of ``trainer.global_step``: a batch
that steps several optimizers by hand (manual optimization) advances Lightning's counter once per optimizer
step, and its ``ProfilerStep#N`` is followed by empty steps up to the new counter. The profiler is created at
the training loop's first action with ``global_step=trainer.global_step``, after a checkpoint's state is
restored, so a resumed run captures the same steps as a fresh one. Rank and world size are the trainer's
``global_rank`` and ``world_size``.

**Phases.** Each Lightning action becomes a :func:`distprof.annotate` range named by :func:`phase_name`:
``[Strategy]DDPStrategy.training_step`` -> ``lightning/training_step``, ``[Strategy]...backward`` ->
``lightning/backward``, ``[LightningModule]M.optimizer_step`` -> ``lightning/optimizer_step`` (in automatic
optimization it encloses training_step and backward, which run in the optimizer's closure),
``[_TrainingEpochLoop].train_dataloader_next`` -> ``lightning/train_dataloader_next``, ``run_training_batch``
-> ``lightning/run_training_batch``; every hook likewise (``lightning/on_train_batch_end`` ...), callbacks keep
their class (``[Callback]ModelCheckpoint{...}.on_train_batch_end`` ->
``lightning/callback/ModelCheckpoint.on_train_batch_end``). ``run_training_epoch`` spans many steps and is no
phase of one: it gets no range.

**Other stages.** ``trainer.validate`` / ``test`` / ``predict`` capture nothing unless named in ``stages``;
then they get their own profiler, role ``{role}/{stage}`` (``main/predict``), whose step N is the N-th batch
(from 0) of that call, ended by the stage's ``*_step``. Validation inside ``fit`` is a phase of the training
step it runs in.

**Faults.** A fault in this glue or in capture is logged once with its traceback and switches profiling off
for the rest of the run (``on_error="disable"``) or re-raises (``"raise"``); the trainer never sees it. A
config that does not fit the job (a rank list beyond the world size, an unwritable ``save_path``) is found when
the profiler is created, at the first training batch, and handled the same way. When ``fit`` fails, Lightning
calls its callbacks' ``on_exception``: the open window is written there (``complete: false``), with the failed
step kept. Without any callback, or when the process dies, :mod:`distprof.capture.shutdown` writes it on the way out.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

try:
    from lightning.pytorch.profilers import Profiler as _LightningProfiler
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("distprof.integrations.lightning needs PyTorch Lightning: "
                      "pip install 'distprof[lightning]'") from e

from distprof.capture.annotate import annotate
from distprof.capture.faults import FaultGuard, misfit
from distprof.capture.profiler import Profiler
from distprof.config.model import ProfilerConfig
from distprof.rundir.layout import sanitize_role

logger = logging.getLogger(__name__)

__all__ = ["DistprofProfiler", "phase_name"]

STAGES = ("fit", "validate", "test", "predict")
# The training loop's first actions: by then a checkpoint's loop state (the global step) is restored.
_FIT_FIRST = frozenset({"run_training_epoch", "[_TrainingEpochLoop].train_dataloader_next", "run_training_batch"})
_EVAL = {  # stage -> (its loop's fetch action, the suffix of the action that ends one batch)
    "validate": ("[_EvaluationLoop].val_next", ".validation_step"),
    "test": ("[_EvaluationLoop].test_next", ".test_step"),
    "predict": ("[_PredictionLoop].predict_next", ".predict_step"),
}
_SPANNING = frozenset({"run_training_epoch"})  # encloses many steps: a range would swallow every phase
_NAME_CACHE_LIMIT = 1024  # user actions with dynamic names must not grow the cache forever


def phase_name(action: str) -> str | None:
    """The ``annotate`` name of a Lightning action; None for actions that span steps.

    ``[Kind]Owner.hook`` -> ``lightning/hook`` for the strategy, the module, the datamodule and the loops (there
    is one of each); ``[Callback]Key.hook`` -> ``lightning/callback/Class.hook`` (there are many callbacks; the
    state key's ``{...}`` arguments are dropped); an unprefixed action (``run_training_batch``, a user's own
    ``trainer.profiler.profile("x")``) -> ``lightning/x``.
    """
    if action in _SPANNING:
        return None
    if action.startswith("[") and "]" in action:
        kind, _, rest = action[1:].partition("]")
        owner, dot, hook = rest.rpartition(".")
        if not dot:  # "[Kind]name" without an owner
            hook, owner = rest, ""
        if kind == "Callback":
            cls = owner.split("{", 1)[0] or "callback"
            return f"lightning/callback/{cls}.{hook}"
        return f"lightning/{hook}"
    return f"lightning/{action}"


class DistprofProfiler(_LightningProfiler):
    """A Lightning profiler that captures with distprof: ``Trainer(profiler=DistprofProfiler(config))``.

    ``config``: a :class:`~distprof.ProfilerConfig` or a dict (validated here: a bad one raises ``ValueError``).
    ``role``: the distprof role of the training profiler. ``stages``: the trainer entry points that capture
    (default only ``fit``). See the module docstring for the step and phase mappings.
    """

    def __init__(self, config: ProfilerConfig | dict | None = None, role: str = "main",
                 stages: Iterable[str] = ("fit",)) -> None:
        super().__init__()
        self._reset_runtime()
        if config is None:
            config = ProfilerConfig()
        elif not isinstance(config, ProfilerConfig):
            config = ProfilerConfig.from_dict(config)
        if isinstance(stages, str):
            stages = (stages,)
        stages = tuple(stages)
        bad = [s for s in stages if s not in STAGES]
        if bad or not stages:
            raise ValueError(f"stages={stages!r}: expected a non-empty list of {', '.join(STAGES)}; "
                             f"pass e.g. stages=('fit',)")
        self.config = config
        self.role = sanitize_role(role)
        self.stages = stages
        self._off = not (config.enable or config.trigger)  # disabled (or switched off by a fault): no stage is armed
        self._faults = FaultGuard(config.on_error, self._fault_text, self._switch_off, logger)  # capture/faults.py
        self._ranges: dict[str, Any] = {}  # action -> its annotate range (actions without one are not cached)

    def _reset_runtime(self) -> None:
        self._prof: Profiler | None = None  # this stage's distprof profiler, once created
        self._live = False  # _prof exists and may capture: actions become ranges
        self._pending: str | None = None  # a configured stage set up, its profiler not created yet
        self._fit = False  # the live profiler's steps follow trainer.global_step (else: one per batch)
        self._end_suffix = ""  # eval stages: the action that ends one batch
        self._stack: list[tuple[str, Any]] = []  # (action, open range), innermost last
        self._trainer_ref: Any = None
        self._done: list[Profiler] = []  # profilers this object stopped (for summary())

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the trainer with its profiler: keep the settings, not this process's capture.
        state = self.__dict__.copy()
        state.pop("_lightning_module", None)  # a weakref proxy Lightning sets again in the new process
        for key in ("_prof", "_trainer_ref"):
            state[key] = None
        state.update(_live=False, _pending=None, _stack=[], _done=[])
        return state

    # ---- Lightning's profiler interface ------------------------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        if not self._off:
            self._guard("setup", self._setup, getattr(stage, "value", stage))  # TrainerFn is a str enum

    def start(self, action_name: str) -> None:
        # Called around every Lightning action (~20 per batch): the common cases are inlined.
        if not self._live:
            if self._pending is None:
                return  # disabled, not selected, or not a configured stage
            if self._first_action(self._pending, action_name):
                self._guard("start", self._create)
            if not self._live:
                return
        try:
            rng = self._ranges.get(action_name)
            if rng is None:
                rng = self._range_for(action_name)
                if rng is None:
                    return
            rng.__enter__()
            self._stack.append((action_name, rng))
        except Exception:
            if self._faults.fault("start"):
                raise

    def stop(self, action_name: str) -> None:
        if not self._live:
            return
        try:
            stack = self._stack
            if stack and stack[-1][0] == action_name:
                stack.pop()[1].__exit__(None, None, None)
            else:
                self._close_to(action_name)
            prof = self._prof  # live: created
            if prof is None:
                return
            if self._fit:
                if action_name == "run_training_batch":
                    self._sync_step(prof)
            elif action_name.endswith(self._end_suffix) and action_name.startswith("[Strategy]"):
                prof.step()
        except Exception:
            if self._faults.fault("stop"):
                raise

    def summary(self) -> str:
        """One line per profiler this run used: where its files went. Stops capture (Lightning calls it last)."""
        if self._off:
            return ""
        return self._guard("summary", self._summary) or ""

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage)
        if not getattr(self, "_off", True):  # also reached from __del__ of a half-built object
            self._guard("teardown", self._finish)

    # ---- what each hook does --------------------------------------------------------------------------
    def _setup(self, stage: str) -> None:
        self._finish()  # a previous run that failed without on_exception: close it before a new one
        self._pending = stage if stage in self.stages else None
        module = getattr(self, "_lightning_module", None)
        self._trainer_ref = weakref.ref(module.trainer) if self._pending and module is not None else None
        if self._pending and self._trainer_ref is None:
            raise RuntimeError("Lightning did not attach its module to the profiler before setup()")

    def _summary(self) -> str:
        self._finish()
        lines = []
        for p in self._done:
            if p.enabled:
                lines.append(f"distprof: role {p.role!r} rank {p.rank}: {p.windows_closed} window(s) in {p.save_dir}")
            else:
                lines.append(f"distprof: role {p.role!r} rank {p.rank}: not captured (not selected, or switched off)")
        self._done = []
        return "\n".join(lines)

    # ---- glue -------------------------------------------------------------------------------------------
    def _first_action(self, stage: str, action: str) -> bool:
        if stage == "fit":
            return action in _FIT_FIRST
        return action == _EVAL[stage][0]

    def _create(self) -> None:
        stage, self._pending = self._pending, None
        if stage is None:  # (start() calls this with a stage set up)
            return
        trainer = self._trainer_ref()
        if trainer is None:
            raise RuntimeError("the trainer was garbage-collected before its first batch")
        fit = stage == "fit"
        role = self.role if fit else f"{self.role}/{stage}"
        try:
            prof = Profiler(self.config, role=role, global_step=trainer.global_step if fit else 0,
                            rank=trainer.global_rank, world_size=trainer.world_size)
        except ValueError as e:  # the config does not fit this job (ranks, save_path): a fault, not a crash
            if misfit(self.config.on_error, e, logger):
                raise
            self._off = True
            return
        self._fit, self._end_suffix = fit, ("" if fit else _EVAL[stage][1])
        self._prof = prof
        self._live = prof.enabled
        if self._live:
            prof.start()
            self._live = prof.enabled  # a fault in start() switched it off

    def _range_for(self, action: str) -> Any:
        """The range of ``action`` (None: no range); cached, except the actions that need a decision each time."""
        if action.endswith(".on_exception"):
            # Lightning is unwinding a failed run: the step in progress ends here; keep what it recorded.
            self._finish(sys.exc_info())
            return None
        name = phase_name(action)
        rng = None if name is None else annotate(name)
        if rng is not None and len(self._ranges) < _NAME_CACHE_LIMIT:
            self._ranges[action] = rng
        return rng

    def _close_to(self, action: str) -> None:
        """Close ``action``'s range and any opened inside it and still open (ranges close innermost first)."""
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] == action:
                for _, rng in reversed(stack[i:]):
                    rng.__exit__(None, None, None)
                del stack[i:]
                return
        # never started (or already closed with an enclosing action): nothing to do

    def _close_all(self) -> None:
        stack, self._stack = self._stack, []
        for _, rng in reversed(stack):
            rng.__exit__(None, None, None)

    def _sync_step(self, prof: Profiler) -> None:
        """End distprof steps until they match ``trainer.global_step`` (one per optimizer step)."""
        trainer = self._trainer_ref()
        if trainer is None:
            return
        target = trainer.global_step
        while prof.global_step < target and self._live:
            prof.step()
            self._live = prof.enabled

    def _finish(self, exc_info: tuple | None = None) -> None:
        """Close every open range, end the steps that finished, stop the profiler (with the failure, if any)."""
        self._close_all()
        prof, self._prof = self._prof, None
        self._pending = None
        if prof is None:
            return
        if self._live and self._fit:
            self._sync_step(prof)
        self._live = False
        if exc_info is not None and exc_info[0] is not None:
            prof.__exit__(*exc_info)  # the step in progress failed: it stays in the trace
        else:
            prof.stop()
        self._done.append(prof)

    def _guard(self, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn``; a fault is logged once and switches profiling off, or re-raises with on_error="raise"."""
        return self._faults.call(where, fn, *args)

    def _fault_text(self, where: str) -> str:
        return f"distprof: the Lightning profiler failed during {where}; profiling is off for the rest of the run"

    def _switch_off(self, where: str = "") -> None:
        prof, self._prof, self._live, self._pending, self._off = self._prof, None, False, None, True
        try:
            self._close_all()
            if prof is not None:
                prof.stop()
        except Exception:  # already failing: nothing more can be done, and the first fault is logged
            logger.debug("distprof: cleanup after a fault failed too", exc_info=True)
