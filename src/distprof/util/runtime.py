"""Facts about the running process: rank, world size, host, versions. No heavy imports."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

__all__ = ["detect_local_rank", "detect_rank_world", "host_name", "launcher_rank", "torch_version"]


VERSION = "0.1.0"  # the package's own version (distprof.__version__), for a checkout not installed

def _dist_rank_world() -> tuple[int, int] | None:
    # Only look at torch.distributed when the job already imported it: never import torch here.
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - a broken process group is not ours to report
        return None
    return None


def _env_rank_world() -> tuple[int, int] | None:
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK"))
    world = os.environ.get("WORLD_SIZE", os.environ.get("LOCAL_WORLD_SIZE"))
    if rank is None or not rank.strip().isdigit():
        return None
    w = int(world) if world and world.strip().isdigit() else int(rank) + 1
    return int(rank), max(w, int(rank) + 1)


def _ray_rank_world() -> tuple[int, int] | None:
    if "ray" not in sys.modules:
        return None
    try:
        import ray

        if not ray.is_initialized():
            return None
        from ray import train

        ctx = train.get_context()
        return ctx.get_world_rank(), ctx.get_world_size()
    except Exception:
        return None


def detect_rank_world() -> tuple[int, int]:
    """torch.distributed, then RANK / WORLD_SIZE / LOCAL_RANK, then Ray Train's context, else (0, 1)."""
    for probe in (_dist_rank_world, _env_rank_world, _ray_rank_world):
        found = probe()
        if found is not None:
            return found
    return 0, 1


def detect_local_rank(rank: int) -> int | None:
    """This process's rank on its node: LOCAL_RANK (torchrun, Ray Train, most launchers), else
    ``rank % LOCAL_WORLD_SIZE``; None when neither says (a node's size is never guessed)."""
    local = os.environ.get("LOCAL_RANK", "").strip()
    if local.isdigit():
        return int(local)
    per_node = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if per_node.isdigit() and int(per_node) > 0:
        return rank % int(per_node)
    return None


def _digits(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def launcher_rank(environ: Mapping[str, str] | None = None) -> tuple[int, int | None, int, str] | None:
    """(rank, local rank, world size, the variable read) as the launcher set them, before any process group
    exists: torchrun and plain launches (RANK, LOCAL_RANK, WORLD_SIZE), else SLURM's srun (SLURM_PROCID,
    SLURM_LOCALID, SLURM_NTASKS; under srun + torchrun, torchrun's RANK wins). None when neither is set."""
    env = os.environ if environ is None else environ
    for rank_var, local_var, world_var in (("RANK", "LOCAL_RANK", "WORLD_SIZE"),
                                           ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")):
        rank = _digits(env, rank_var)
        if rank is not None:
            world = _digits(env, world_var)
            return rank, _digits(env, local_var), max(world or 0, rank + 1), rank_var
    return None


def host_name() -> str:
    return socket.gethostname()


def torch_version() -> str | None:
    t = sys.modules.get("torch")
    v = getattr(t, "__version__", None) if t is not None else None
    return str(v) if v is not None else None


def distprof_version() -> str:
    """The installed distprof's version (importlib.metadata), else the package's own (a checkout not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("distprof")
    except PackageNotFoundError:
        return VERSION
