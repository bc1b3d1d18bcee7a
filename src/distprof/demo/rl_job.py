"""A small RL job on a local Ray cluster, profiled by distprof from one config.

Three worker groups, as in verl / SkyRL / slime: a rollout group samples
sequences from a tiny policy, a reference group scores their log-probs, and an
actor group of 2 ranks does a policy-gradient update, all-reducing gradients
over gloo, then syncs weights to the rollout worker. Everything runs on CPU,
on loopback, in well under a minute. Workers write traces to node-local
scratch space; ``collect`` brings them to the run directory through Ray, and
``check`` proves it complete.

The driver (this process) is profiled as role ``driver`` and keeps Ray's task timeline of every window. The
rollout worker drives a STAND-IN inference engine (:mod:`.engine_standin`; vLLM and SGLang need CUDA) over
SGLang's HTTP profiling API; the rollout role's ``engine`` setting makes distprof start and stop the engine's own
profiler at the same steps, and its traces land as the role ``rollout/engine``.

One component is deliberately slow (``slow``, ``{"ROLE/PHASE": ms}``; by default
``{"actor/prepare": SLOW_MS}``): a sleep inside that annotated phase of that role (of
actor rank 1 for an actor phase, so the other actor rank waits for it in every gradient
all-reduce: a real straggler). ``distprof diagnose`` has a real cause to find wherever it
is put; :data:`PHASES` lists where it can go. ``slow={}`` makes every worker equal.

The driver (this process) is profiled as role ``driver`` (``profiling(groups, driver=True)``), its phases
``driver/generate``, ``driver/reference``, ``driver/update`` and ``driver/sync_weights`` the RL loop's stages
(verl's ``gen``, ``ref``, ``update_actor``, weight sync), and Ray's task timeline of each window is kept beside
its trace. ``async_rollout=True`` runs the job one step off-policy (verl's and slime's asynchronous modes): the
rollout generates step N+1 while the actor trains on step N.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import distprof
from distprof.integrations.ray import ProfiledGroup, ProfiledWorker, profiling, step_all
from distprof.util.logs import WHERE_LOGGER

logger = logging.getLogger(__name__)

VOCAB, HIDDEN, SEQ, BATCH = 64, 64, 24, 32
SLOW_MS = 150.0  # actor rank 1's extra batch preparation per step (the demo's straggler)
SLOW_RANK = 1
ENGINE_RANKS, ENGINE_ITERATIONS = 2, 4  # the stand-in engine's TP ranks; its iterations per generation
# Where ``slow`` may put a sleep: each role's annotated phases (an actor phase on rank SLOW_RANK only).
PHASES = ("rollout/generate", "rollout/load_weights", "ref/log_probs", "actor/prepare", "actor/update",
          "actor/sync_weights")


def parse_slow(specs: list[str]) -> dict[str, float]:
    """``["rollout/generate:300", ...]`` -> ``{"rollout/generate": 300.0}``; ValueError naming the valid phases."""
    out: dict[str, float] = {}
    for spec in specs:
        phase, sep, ms = str(spec).rpartition(":")
        try:
            value = float(ms) if sep else -1.0
        except ValueError:
            value = -1.0
        if phase not in PHASES or not value >= 0 or value > 600_000:
            raise ValueError(f"--slow {spec!r}: use ROLE/PHASE:MS (0 to 600000 ms) with ROLE/PHASE one of "
                             f"{', '.join(PHASES)}")
        out[phase] = value
    return out


@dataclass
class RLDemoResult:
    run_dir: str
    steps: int
    rewards: list[float]
    files: list[dict[str, Any]] = field(default_factory=list)
    check: Any = None
    collect: Any = None


def _policy():
    import torch

    torch.set_num_threads(1)  # four workers share two cores
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
                               torch.nn.Linear(HIDDEN, VOCAB))


def _log_probs(model, seqs):
    import torch

    logits = model(seqs[:, :-1])
    return torch.log_softmax(logits, -1).gather(-1, seqs[:, 1:, None]).squeeze(-1)


def _slow(worker: Any, phase: str) -> None:
    """The injected slowness of ``phase`` on this worker (``run(slow=...)``), inside the phase's annotation."""
    s = worker.slow.get(phase, 0.0)
    if s > 0:
        time.sleep(s)  # the demo's deliberate cause, for the diagnosis to find


class Rollout(ProfiledWorker):
    """Samples the batch from the policy, and drives an inference engine for each generation as verl's rollout
    drives vLLM or SGLang: here the STAND-IN engine (:mod:`.engine_standin`: SGLang's profiling API over HTTP,
    2 "TP rank" processes of its own running a tiny model), whose traces distprof takes as ``rollout/engine``."""

    def __init__(self, slow: dict[str, float] | None = None):
        from distprof.demo.engine_standin import StandinServer

        self.model = _policy()
        self.slow = slow or {}
        self.engine = StandinServer("sglang", ranks=ENGINE_RANKS)

    def engine_url(self) -> str:
        return self.engine.url

    def close_engine(self) -> None:
        self.engine.close()

    @distprof.annotate("rollout/generate")
    def generate(self, seed: int):
        import json
        import urllib.request

        import torch

        _slow(self, "rollout/generate")
        req = urllib.request.Request(self.engine.url + "/generate", method="POST",
                                     data=json.dumps({"iterations": ENGINE_ITERATIONS}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:  # the engine's forward passes for this batch
            r.read()
        g = torch.Generator().manual_seed(seed)
        tok = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
        with torch.no_grad():
            for _ in range(SEQ - 1):
                probs = torch.softmax(self.model(tok[:, -1]), -1)
                tok = torch.cat([tok, torch.multinomial(probs, 1, generator=g)], 1)
        return tok

    @distprof.annotate("rollout/load_weights")
    def load_weights(self, state):
        _slow(self, "rollout/load_weights")
        self.model.load_state_dict(state)


class Reference(ProfiledWorker):
    def __init__(self, slow: dict[str, float] | None = None):
        self.model = _policy()
        self.slow = slow or {}

    @distprof.annotate("ref/log_probs")
    def log_probs(self, seqs):
        import torch

        _slow(self, "ref/log_probs")
        with torch.no_grad():
            return _log_probs(self.model, seqs)


class Actor(ProfiledWorker):
    def __init__(self, rank: int, world_size: int, init_file: str, slow: dict[str, float] | None = None):
        import torch
        import torch.distributed as dist

        self.init_file = init_file
        self.slow = slow or {}  # a slow data path (or update) on this rank: the demo's straggler
        self.rank, self.world_size = rank, world_size
        self.model = _policy()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)
        self.dist = dist

    def init_process_group(self):
        self.dist.init_process_group("gloo", init_method=f"file://{self.init_file}", rank=self.rank,
                                     world_size=self.world_size)
        return self.rank

    def update(self, seqs, ref_lp):
        shard = slice(self.rank * len(seqs) // self.world_size, (self.rank + 1) * len(seqs) // self.world_size)
        seqs, ref_lp = seqs[shard], ref_lp[shard]
        with distprof.annotate("actor/prepare"):
            _slow(self, "actor/prepare")  # slow data preparation: the other rank waits at the all-reduce
        with distprof.annotate("actor/update"):
            _slow(self, "actor/update")
            reward = (seqs[:, 1:] % 2 == 0).float().mean(1)  # the task: emit even tokens
            lp = _log_probs(self.model, seqs)
            adv = reward - reward.mean()
            loss = -(adv[:, None] * lp).mean() + 0.05 * (lp - ref_lp).pow(2).mean()
            loss.backward()
            with distprof.annotate("actor/allreduce"):
                for p in self.model.parameters():
                    self.dist.all_reduce(p.grad)
                    p.grad /= self.world_size
            self.opt.step()
            self.opt.zero_grad()
        return float(reward.mean())

    @distprof.annotate("actor/sync_weights")
    def sync_weights(self):
        _slow(self, "actor/sync_weights")
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def shutdown(self):
        self.dist.destroy_process_group()


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Ray's gcs, raylet, workers...), from /proc."""
    from distprof.util.procfs import parent_pid

    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    from distprof.util.procfs import alive

    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            logger.warning("distprof demo: Ray processes %s still running after shutdown",
                           [p for p in pids if alive(p)])
            return
        time.sleep(0.05)  # other processes' exit: nothing to block on


def _slow_plan(slow: dict[str, float] | None, slow_ms: float | None) -> dict[str, float]:
    """The slowness to inject, in ms: ``slow`` over ``slow_ms`` (actor/prepare), default actor/prepare SLOW_MS."""
    if slow is None and slow_ms is None:
        return {"actor/prepare": SLOW_MS}
    plan = {"actor/prepare": float(slow_ms)} if slow_ms is not None else {}
    for phase, ms in (slow or {}).items():
        if phase not in PHASES or not isinstance(ms, (int, float)) or not ms >= 0:
            raise ValueError(f"slow {phase!r}: {ms!r}: use {{ROLE/PHASE: ms >= 0}} with ROLE/PHASE one of "
                             f"{', '.join(PHASES)}")
        plan[phase] = float(ms)
    return plan


def run(out: str, steps: int = 5, profile_steps: list[int] | None = None,
        progress: Callable[[str], None] | None = None, slow_ms: float | None = None, on_demand: bool = False,
        after_step: Callable[[int, list[ProfiledGroup]], Any] | None = None, slow: dict[str, float] | None = None,
        async_rollout: bool = False) -> RLDemoResult:
    """Run the job on a fresh local Ray cluster (loopback only), shut down at the end, and return what landed
    in ``out``. A process already connected to Ray runs it there instead, and stays connected (its cluster needs
    1 CPU free for the four actors).

    ``slow``: ``{"ROLE/PHASE": ms}`` (see :data:`PHASES`; an actor phase slows rank 1 only); default
    ``{"actor/prepare": SLOW_MS}``. ``slow_ms`` (older name) is ``slow={"actor/prepare": slow_ms}``, merged under
    ``slow``. ``async_rollout``: generate step N+1 while the actor trains on step N (one step off-policy).

    ``on_demand``: the workers opt in to on-demand capture (``trigger: true``) and capture nothing else;
    ``after_step(step, groups)`` runs on the driver after every step (e.g. ``trigger_all(groups, steps=2)``).
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # bind to 127.0.0.1, not the external address
    import msgspec
    import ray

    from distprof.analysis.check import check_run
    from distprof.demo.gloo_job import rendezvous_file
    from distprof.integrations.ray import collect
    from distprof.rundir.store import manifest_records

    say = progress or (lambda msg: logger.info("%s", msg))
    slow_s = {k: v / 1e3 for k, v in _slow_plan(slow, slow_ms).items()}
    actor_slow = {k: v for k, v in slow_s.items() if k.startswith("actor/")}
    profile_steps = profile_steps or [max(1, steps - 3), max(1, steps - 2)]
    scratch = tempfile.mkdtemp(prefix="distprof-scratch-")  # node-local: collect() moves files through Ray
    rdzv = tempfile.mkdtemp(prefix="distprof-rdzv-")  # the actors' torch.distributed rendezvous file
    # Default activities: CPU plus whichever accelerator this machine has.
    engine_out = tempfile.mkdtemp(prefix="distprof-engine-")  # where the engine writes; distprof takes its traces
    own = not ray.is_initialized()  # connected already: run on that session, and leave it up
    if own:
        say("starting a local Ray cluster on 127.0.0.1")
        # address="local": always a cluster of its own, even where another Ray cluster runs on this machine
        # (without it ray.init joins that one, and refuses num_cpus).
        ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
        addresses = {n["NodeManagerAddress"] for n in ray.nodes()}
        if addresses != {"127.0.0.1"}:  # ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set
            logger.warning("distprof demo: Ray bound to %s, not loopback only", ", ".join(sorted(addresses)))
    started: list[Any] = []  # the actors, ended with the run on a session it joined (it leaves that as it was)
    try:
        opts = dict(num_cpus=0.25)  # 4 actors use 1 of 2 CPUs: tasks (collect) still get scheduled
        rollout = [ray.remote(**opts)(Rollout).remote(slow_s)]
        ref = [ray.remote(**opts)(Reference).remote(slow_s)]
        actors = [ray.remote(**opts)(Actor).remote(r, 2, rendezvous_file(rdzv), actor_slow if r == SLOW_RANK else {})
                  for r in range(2)]
        started = rollout + ref + actors
        ray.get([a.init_process_group.remote() for a in actors])
        # The rollout role drives its engine's profiler at the same steps (the engine setting, per role).
        engine = {"kind": "sglang", "url": ray.get(rollout[0].engine_url.remote()), "trace_dir": engine_out}
        config = (distprof.ProfilerConfig(trigger=True, save_path=scratch, ranks="all") if on_demand else
                  distprof.ProfilerConfig(enable=True, save_path=scratch, ranks="all", steps=profile_steps,
                                          per_role={"rollout": {"engine": engine}}))
        groups = [ProfiledGroup(rollout, config, "rollout"), ProfiledGroup(ref, config, "ref"),
                  ProfiledGroup(actors, config, "actor")]
        rewards = []
        # The driver is a role of its own (its phases below), and keeps Ray's task timeline of every window. Its
        # "traces go to" line would name the scratch folder, gone after collect: the demo says where they land.
        where = logging.getLogger(WHERE_LOGGER)
        level, where.level = where.level, logging.WARNING
        with contextlib.ExitStack() as undo, profiling(groups, driver=True) as groups:
            undo.callback(where.setLevel, level)
            nxt = None  # asynchronous: the batch generated during the previous step
            for step in range(steps):
                say(f"step {step}: generate, score, update, sync"
                    + (" (rollout one step ahead)" if async_rollout else ""))
                with distprof.annotate("driver/generate"):
                    seqs = nxt if nxt is not None else rollout[0].generate.remote(step)
                    ray.wait([seqs], fetch_local=False)
                # One step off-policy: the next batch is generated (with the weights before this update) while
                # this one trains.
                nxt = rollout[0].generate.remote(step + 1) if async_rollout and step + 1 < steps else None
                with distprof.annotate("driver/reference"):
                    ref_lp = ref[0].log_probs.remote(seqs)
                    ray.wait([ref_lp], fetch_local=False)
                with distprof.annotate("driver/update"):
                    rewards.append(sum(ray.get([a.update.remote(seqs, ref_lp) for a in actors])) / len(actors))
                with distprof.annotate("driver/sync_weights"):
                    ray.get(rollout[0].load_weights.remote(actors[0].sync_weights.remote()))
                # All groups end the step together: one group's trace export (when a window
                # closes here) runs while the others have already ended theirs, not inside them.
                step_all(groups)
                if after_step is not None:
                    after_step(step, groups)
        ray.get([a.shutdown.remote() for a in actors] + [rollout[0].close_engine.remote()])
        say("collecting traces through Ray")
        report = collect(groups, out)
    finally:
        if own:
            spawned = _descendants(os.getpid())
            ray.shutdown()
            _wait_gone(spawned, timeout_s=30)  # ray.shutdown() returns while raylet and gcs still exit
        else:  # their handles may sit in a reference cycle until the next gc: their CPUs would stay held
            for a in started:
                ray.kill(a)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(engine_out, ignore_errors=True)
        shutil.rmtree(rdzv, ignore_errors=True)
    result = RLDemoResult(run_dir=os.path.abspath(out), steps=steps, rewards=rewards, collect=report,
                          check=check_run(out))
    result.files = [msgspec.to_builtins(r) for r in manifest_records(out)]
    return result
