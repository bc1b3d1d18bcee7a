"""torch.profiler against training code that replaces parameters with ``torch.utils.swap_tensors``.

``nn.Module._apply`` (``module.cpu()``, ``module.to(device)``, ``.half()`` ...) replaces every
tensor-subclass parameter, FSDP2's DTensors among them, with ``torch.utils.swap_tensors``, which
refuses a tensor that anything holds a weak reference to. torch.profiler's ``record_shapes`` (and
``with_flops``, which records shapes too) keeps a weak reference to every input of every recorded op
(so that a freed tensor's address reused later is not mistaken for the same tensor); the optimizer
step's ops take the sharded parameters as inputs. So a trainer that moves an FSDP2 model between devices
by hand while a window records, as verl's and SkyRL's colocated trainers do without FSDP2's own
``CPUOffloadPolicy`` (``offload_fsdp2_model_to_cpu``: ``model.cpu()``), dies with
``RuntimeError: _apply(): Couldn't swap ...Linear.weight``. Measured on torch 2.13 (CPU, gloo, 2
ranks): ``record_shapes`` and ``with_flops`` trigger it; ``profile_memory``, ``with_stack`` and
``with_modules`` do not; warm-up steps do not; FSDP2's ``CPUOffloadPolicy`` never swaps.

Two consequences, both handled here:

* :func:`window_options`: when a window opens in a process holding FSDP2 modules that are not offloaded
  by ``CPUOffloadPolicy`` (so a hand-written offload may swap their parameters), ``record_shapes`` and
  ``with_flops`` are turned off for the window, with one warning naming them, the reason and the fixes.
  A crash of training costs more than shapes in the trace (distprof never crashes training).
* :func:`release`: the weak references live as long as torch's profile results, and a
  ``torch.profiler.profile`` object is in a reference cycle, so it is freed only when the cyclic garbage
  collector next runs: until then every swap failed, after the window too. The results are dropped as
  soon as the window's files are written.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from distprof.config.model import TorchOptions

logger = logging.getLogger(__name__)

__all__ = ["SWAP_BLOCKING_FLAGS", "fsdp2_swap_risk", "release", "window_options"]

# The torch.profiler flags whose results hold weak references to op inputs (see the module docstring).
SWAP_BLOCKING_FLAGS = ("record_shapes", "with_flops")

_warned = False


def fsdp2_swap_risk() -> list[str]:
    """Class names of the live FSDP2 modules whose parameters are not under ``CPUOffloadPolicy``.

    Empty when FSDP2 was never imported (nothing is imported here for the check). Reads FSDP2's state
    through torch internals (as in torch 2.13); a module whose policy cannot be read counts as at risk.
    """
    if "torch.distributed.fsdp._fully_shard" not in sys.modules:
        return []
    try:
        from torch.distributed._composable_state import _module_state_mapping
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule
    except ImportError:  # pragma: no cover  (a torch without FSDP2)
        return []
    risky = []
    for module in list(_module_state_mapping.keys()):  # a weak mapping: copy before walking it
        if not isinstance(module, FSDPModule):
            continue
        try:
            groups = module._get_fsdp_state()._fsdp_param_groups
            offloaded = all(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups)
        except AttributeError:  # torch moved its internals: be safe rather than crash training later
            offloaded = False
        if not offloaded:
            risky.append(type(module).__name__)
    return risky


def window_options(opts: TorchOptions) -> tuple[TorchOptions, list[str]]:
    """The options a window opening now uses, and the flags turned off for it (see the module docstring)."""
    on = [f for f in SWAP_BLOCKING_FLAGS if getattr(opts, f)]
    if not on:
        return opts, []
    risky = fsdp2_swap_risk()
    if not risky:
        return opts, []
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "distprof: turning off torch.%s in capture windows: this process holds FSDP2 modules (%s) without "
            "CPUOffloadPolicy, and moving them by hand (model.cpu() / model.to(device), as colocated RL trainers "
            "offload) while a window records makes torch raise \"_apply(): Couldn't swap\" (torch.profiler keeps "
            "weak references to recorded op inputs, which torch.utils.swap_tensors refuses). To keep %s, shard "
            "with fully_shard(..., offload_policy=CPUOffloadPolicy()) instead of moving the model by hand",
            " and torch.".join(on), ", ".join(sorted(set(risky))), " and ".join(on))
    return opts.model_copy(update={f: False for f in on}), on


def release(prof: Any) -> None:
    """Drop a finished ``torch.profiler.profile``'s results now rather than at the next cyclic GC."""
    try:
        prof.profiler = None
    except AttributeError:  # pragma: no cover  (a torch whose profile has a read-only attribute: keep it)
        logger.debug("could not drop the profile results", exc_info=True)
