"""``distprof wrap [--config FILE] -- CMD ...``: one rank of a torchrun, SLURM ``srun`` or plain launch, under the
configured process tool (nsys, rocprof_sys, py_spy, memray) when the config selects it, else CMD itself.

- The rank: RANK / LOCAL_RANK / WORLD_SIZE (torchrun, plain launches), else SLURM_PROCID / SLURM_LOCALID /
  SLURM_NTASKS (srun); none set: a single process, rank 0 of 1 (:func:`distprof.util.runtime.launcher_rank`).
- Selected (profiling on, a process backend, the role in ``roles``, the rank in ``ranks`` and ``per_node``): the
  tool runs CMD through the Ray path's wrapper loop (:func:`distprof.capture.wrap.wrap_process`): the same options
  (nsys: capture ranges on the planned global steps, marked by CMD's own Profiler), output
  ``{save_path}/{role}/{backend}-pid{P}.rank{R:05d}{ext}`` (:func:`distprof.rundir.layout.process_output_name`),
  published when the tool is done, and ``run.json`` / ``{role}/role.json`` written first, so ``distprof check``
  reads the run even when CMD never builds a Profiler.
- Not selected: this process becomes CMD (exec): no extra process, nothing to pay.
- A tool that cannot start (not installed, not runnable with CMD's interpreter, an unwritable save_path): CMD runs
  unwrapped after one warning; training is never lost. A config that cannot be used is refused (ValueError).
- CMD's exit code passes through unchanged; a CMD killed by signal N ends this process by signal N too.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from distprof.capture.backends.process import spec_for
from distprof.capture.runinfo import role_info, run_info
from distprof.capture.wrap import exit_like, wrap_process
from distprof.config.plan import role_selected
from distprof.rundir.layout import ROLE_JSON, is_url, sanitize_role
from distprof.rundir.store import RunDir
from distprof.util.runtime import launcher_rank

if TYPE_CHECKING:  # pragma: no cover
    from distprof.config.model import ProfilerConfig

__all__ = ["Decision", "decide", "wrap_command"]

logger = logging.getLogger(__name__)

DEFAULT_ROLE = "main"  # the Profiler's default role


@dataclass(frozen=True)
class Decision:
    """Whether this rank runs under the tool, and why."""

    role: str
    rank: int
    local_rank: int | None
    world_size: int
    source: str | None  # the variable the rank came from (RANK, SLURM_PROCID); None: none was set
    selected: bool
    why: str  # one line: what selected or skipped this rank


def default_role(config: ProfilerConfig) -> str:
    """The role ``distprof wrap`` files outputs under without ``--role``: the one role ``roles`` names, if it names
    exactly one plain name, else ``main`` (the Profiler's default)."""
    roles = config.roles
    if roles and len(roles) == 1 and not any(c in roles[0] for c in "*?["):
        return roles[0]
    return DEFAULT_ROLE


def decide(config: ProfilerConfig, role: str | None = None, environ: dict[str, str] | None = None) -> Decision:
    """Which rank this process is, and whether ``config`` wraps it (pure but for reading ``environ``)."""
    role = sanitize_role(role if role is not None else default_role(config))
    config = config.for_role(role)
    found = launcher_rank(environ)
    rank, local, world, source = found if found is not None else (0, 0, 1, None)

    def out(selected: bool, why: str) -> Decision:
        return Decision(role, rank, local, world, source, selected, why)

    if not config.enable:
        return out(False, "profiling is off in this config (enable: false)")
    if not config.is_process_backend:
        return out(False, f"backend {config.backend!r} captures inside the process, not around it: "
                          "use distprof's Profiler in CMD (nothing to wrap)")
    if not role_selected(config.roles, role):
        return out(False, f"role {role!r} is not in roles {config.roles}")
    if isinstance(config.ranks, dict):
        raise ValueError(f"ranks selects by mesh coordinates ({config.ranks}), which distprof wrap cannot see: it "
                         "knows rank numbers only; give a list of ranks, e.g. ranks: [0, 8]")
    config.check_world_size(world)
    if not config.selects_rank(rank, world, None, local):
        return out(False, f"rank {rank} is not selected (ranks: {config.ranks}, per_node: {config.per_node})")
    return out(True, f"rank {rank} of {world} is selected")


def wrap_command(config: ProfilerConfig, cmd: list[str], role: str | None = None) -> int:
    """Run CMD as this rank should: under the tool, or as itself (exec: does not return). Returns the exit code
    (a CMD killed by a signal ends this process by it first: :func:`distprof.capture.wrap.exit_like`)."""
    if not cmd:
        raise ValueError("distprof wrap needs a command after --, e.g. distprof wrap -- python train.py")
    if cmd[0].startswith("-"):  # `distprof wrap --confg x.yaml -- ...`: an unknown option lands in CMD, no program
        raise ValueError(f"distprof wrap: unknown option {cmd[0]!r}; its options are --config and --role, before --, "
                         "e.g. distprof wrap --config profile.yaml -- python train.py")
    if not cmd[0]:  # `distprof wrap -- ''`: as a shell, "not found" (no tool is started for it)
        return _cannot_run(cmd, ValueError("an empty command name"))
    d = decide(config, role)
    if d.source is None and d.rank == 0:
        logger.info("distprof wrap: neither RANK nor SLURM_PROCID is set: a single process, rank 0 of 1")
    if not d.selected:
        if d.rank == 0:  # one line per job, not one per rank
            logger.info("distprof wrap: %s; running %s unwrapped", d.why, cmd[0])
        _exec(cmd)
    config = config.for_role(d.role)
    save_path = config.save_path
    if save_path is None or is_url(save_path):
        raise ValueError(f"save_path {save_path!r}: {config.backend} writes files on each node; give a local (or "
                         "mounted) folder, e.g. save_path: runs/exp1/profile")
    run = RunDir(save_path)  # the folder CMD's Profiler resolves too
    try:
        spec = spec_for(config, d.role, os.path.join(run.root, d.role), [cmd[0]], rank=d.rank)
        _write_run_files(config, run, d)
    except (ValueError, OSError) as e:
        logger.warning("distprof wrap: rank %d runs without %s: %s", d.rank, config.backend, e)
        _exec(cmd)
    logger.info("distprof wrap: %s; %s writes into %s", d.why, config.backend, spec.out_dir)
    try:
        status = wrap_process(spec, cmd[1:], pass_signals=True)
    except OSError as e:  # CMD itself cannot be run (the tool could)
        return _cannot_run(cmd, e)
    return exit_like(status)


def _write_run_files(config: ProfilerConfig, run: RunDir, d: Decision) -> None:
    """run.json and role.json, unless CMD's Profiler (or another rank) wrote them first: the same shape either way."""
    os.makedirs(os.path.join(run.root, d.role), exist_ok=True)
    info = run_info(config, d.world_size, config.plan())
    run.write_run_json(info)
    run.write_run_json(role_info(d.role, info, config.backend), rel=f"{d.role}/{ROLE_JSON}")


def _exec(cmd: list[str]) -> NoReturn:
    """Become CMD; a CMD that cannot be run ends as a shell's would (127: not found, 126: not runnable)."""
    sys.stdout.flush()
    sys.stderr.flush()  # what this process wrote goes before CMD's own lines
    try:
        os.execvp(cmd[0], cmd)
    except (OSError, ValueError) as e:  # ValueError: an empty name or one with a NUL byte, "not found" to a shell
        raise SystemExit(_cannot_run(cmd, e)) from None


def _cannot_run(cmd: list[str], e: OSError | ValueError) -> int:
    why = e.strerror if isinstance(e, OSError) and e.strerror else e
    logger.error("distprof wrap: cannot run %r: %s", cmd[0], why)
    return 127 if isinstance(e, (FileNotFoundError, ValueError)) else 126
