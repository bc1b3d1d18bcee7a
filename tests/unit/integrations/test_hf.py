"""DistprofCallback with a real Hugging Face Trainer (tiny GPT-2 from a config, CPU): the step rule against HF's
own step numbers, phases, gradient-accumulation micro-steps, resume, inert configs, a crash, 2-process DDP."""

import json
import logging
import os
import subprocess
import sys
from functools import partial

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from conftest import JOBS, config, load_trace, trace_files
from hf_job import Probe, fail_in_forward, make_trainer
from tracekit import cli

from distprof.integrations.hf import DistprofCallback

JOB = os.path.join(JOBS, "hf_job.py")
PHASES = {"train/forward_backward", "train/forward", "train/backward", "train/optimizer"}


cfg = partial(config, run=None, typed=False)


def manifest(run, role="main", rank=0):
    path = run / role / f"rank{rank:05d}" / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans(path):
    """The trace's ProfilerStep#N spans and its user_annotation ranges, each as (name, start, end)."""
    events = load_trace(path)["traceEvents"]
    steps, ranges = {}, []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "user_annotation":
            continue
        if e["name"].startswith("ProfilerStep#"):
            steps[int(e["name"].split("#")[1])] = (e["ts"], e["ts"] + e["dur"])
        else:
            ranges.append((e["name"], e["ts"], e["ts"] + e["dur"]))
    return steps, ranges, events


def in_step(steps, ranges):
    """step number -> the names of the ranges that lie inside it, in time order."""
    out = {n: [] for n in steps}
    for name, t0, t1 in sorted(ranges, key=lambda r: r[1]):
        for n, (s0, s1) in steps.items():
            if s0 <= t0 and t1 <= s1:
                out[n].append(name)
    return out


def ops(events):
    """(event, (name, start, end)) of the trace's CPU ops."""
    return [(e, (e["name"], e["ts"], e["ts"] + e["dur"])) for e in events
            if e.get("ph") == "X" and e.get("cat") == "cpu_op"]


def within(inner, outer):
    return outer[1] <= inner[1] and inner[2] <= outer[2]


def train(out, config, **kw):
    cb = DistprofCallback(config, **{k: kw.pop(k) for k in ("micro_steps",) if k in kw})
    trainer = make_trainer(out / "hf", cb, **kw)
    return trainer, cb


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Steps [3, 4] of a 6-step run that also saves checkpoint-2 (for the resume test)."""
    out = tmp_path_factory.mktemp("fresh")
    trainer, _ = train(out, cfg(out / "run", steps=[3, 4]), max_steps=6, save_strategy="steps", save_steps=2)
    trainer.train()
    return out, trainer


def test_step_n_is_the_update_hf_logs_as_step_n_plus_1(fresh):
    out, trainer = fresh
    run = out / "run"
    [rec] = manifest(run)
    assert rec["steps"] == [3, 4] and rec["complete"] is True
    [path] = trace_files(run)
    steps, ranges, _ = spans(path)
    assert sorted(steps) == [3, 4]
    marks = {n: [r for r in names if r.startswith("probe/")] for n, names in in_step(steps, ranges).items()}
    # distprof step N runs while HF's state.global_step == N and ends when HF has counted it as N+1 ...
    assert marks == {3: ["probe/begin3", "probe/end4"], 4: ["probe/begin4", "probe/end5"]}
    # ... and HF logs that update's loss as step N+1.
    logged = [h["step"] for h in trainer.state.log_history if "loss" in h]
    assert logged == [1, 2, 3, 4, 5, 6]


def test_phases_are_annotations_in_every_captured_step(fresh):
    out, _ = fresh
    [path] = trace_files(out / "run")
    steps, ranges, events = spans(path)
    per_step = in_step(steps, ranges)
    for n in (3, 4):
        assert [r for r in per_step[n] if r.startswith("train/")] == [
            "train/forward_backward", "train/forward", "train/backward", "train/optimizer"]
    by_name = {}
    for r in ranges:
        by_name.setdefault(r[0], []).append(r)
    for fb, fwd, bwd, opt in zip(*(sorted(by_name[p], key=lambda r: r[1]) for p in
                                  ("train/forward_backward", "train/forward", "train/backward", "train/optimizer"))):
        assert within(fwd, fb) and within(bwd, fb) and fwd[2] <= bwd[1] <= bwd[2] <= opt[1]
        # the model's ops are in forward, autograd's in backward, the optimizer's step in train/optimizer
        assert any(e["name"] == "aten::embedding" and within(op, fwd) for e, op in ops(events))
        assert any(e["name"].startswith("autograd::engine::evaluate_function") and within(op, bwd)
                   for e, op in ops(events))
        assert any(r[0].startswith("Optimizer.step#") and within(r, opt) for r in ranges)


@pytest.mark.slow
def test_a_resumed_run_captures_the_same_steps(fresh, tmp_path):
    out, _ = fresh
    trainer, _ = train(tmp_path, cfg(tmp_path / "run", steps=[3, 4]), max_steps=6)
    trainer.train(resume_from_checkpoint=str(out / "hf" / "checkpoint-2"))
    [probe] = [c for c in trainer.callback_handler.callbacks if isinstance(c, Probe)]
    assert probe.begun == [2, 3, 4, 5]  # it did resume: steps 0 and 1 were not run again
    [rec] = manifest(tmp_path / "run")
    assert rec["steps"] == [3, 4] and rec["complete"] is True
    [path] = trace_files(tmp_path / "run")
    steps, ranges, _ = spans(path)
    assert in_step(steps, ranges) == in_step(*spans(trace_files(out / "run")[0])[:2])  # same steps, same marks


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory):
    """k=2 micro-batches per optimizer step over 3 batches per epoch: every epoch's second step is short."""
    out = tmp_path_factory.mktemp("micro")
    config = cfg(out / "run", steps=[4, 5], roles=["main/micro_step"])
    trainer, _ = train(out, config, max_steps=4, n=6, gradient_accumulation_steps=2, save_strategy="steps",
                        save_steps=2)
    trainer.train()
    return out, config


def micro_marks(run):
    [path] = trace_files(run)
    steps, ranges, _ = spans(path)
    return {n: [r for r in names if r.startswith(("probe/", "train/"))] for n, names in in_step(steps, ranges).items()}


def test_micro_steps_are_numbered_global_step_times_k_plus_i(accumulated):
    out, _ = accumulated
    run = out / "run"
    assert not (run / "main" / "rank00000").exists()  # the per-optimizer-step role is not selected: inert
    [rec] = manifest(run, role="main/micro_step")
    assert rec["steps"] == [4, 5]
    # Optimizer steps 0 (micro 0, 1) and 1 (micro 2, and 3 ended empty: the epoch had no batch left) came
    # first, so micro-steps 4 and 5 are optimizer step 2's two micro-batches; only the last one steps.
    assert micro_marks(run) == {
        4: ["probe/begin2", "train/forward_backward", "train/forward", "train/backward"],
        5: ["train/forward_backward", "train/forward", "train/backward", "train/optimizer", "probe/end3"],
    }


def test_a_resumed_run_captures_the_same_micro_steps(accumulated, tmp_path):
    out, config = accumulated
    trainer, _ = train(tmp_path, {**config, "save_path": str(tmp_path / "run")}, max_steps=4, n=6,
                       gradient_accumulation_steps=2)
    trainer.train(resume_from_checkpoint=str(out / "hf" / "checkpoint-2"))
    assert micro_marks(tmp_path / "run") == micro_marks(out / "run")


@pytest.mark.parametrize("config", [{"enable": False}, {"roles": ["critic"]}], ids=["disabled", "role_not_selected"])
def test_an_inert_config_writes_nothing_and_hooks_nothing(tmp_path, config):
    trainer, cb = train(tmp_path, {**cfg(tmp_path / "run", steps=[1, 2]), **config}, max_steps=3)
    trainer.train()
    assert not (tmp_path / "run").exists()
    assert not trainer.model._forward_hooks and not trainer.model._forward_pre_hooks
    assert cb.prof is None and cb.micro is None


def test_a_config_that_does_not_fit_the_job_is_logged_or_raised(tmp_path, caplog):
    config = cfg(tmp_path / "run", steps=[1], ranks=[3])  # world size 1
    trainer, _ = train(tmp_path, config, max_steps=2)
    with caplog.at_level(logging.ERROR, logger="distprof"):
        trainer.train()  # on_error: disable -> training runs, profiling is off
    assert any("profiling is off" in r.getMessage() and "ranks [3] do not exist" in r.getMessage()
               for r in caplog.records)
    assert not (tmp_path / "run").exists()
    trainer, _ = train(tmp_path, {**config, "on_error": "raise"}, max_steps=2)
    with pytest.raises(ValueError, match=r"ranks \[3\] do not exist: world size is 1"):
        trainer.train()


def test_both_roles_at_once_are_refused():
    with pytest.raises(ValueError, match="one window at a time"):
        DistprofCallback(cfg("unused", steps=[1]), micro_steps=True)  # roles None selects main and micro_step


@pytest.mark.slow
def test_a_step_that_raises_keeps_the_captured_steps(tmp_path):
    proc = warmpython.run([sys.executable, JOB, str(tmp_path), "crash", "4"], check=False, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "RuntimeError: boom in forward at step 4" in proc.stderr  # the user's own
    [rec] = manifest(tmp_path / "run")
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "exception"
    [path] = trace_files(tmp_path / "run")
    steps, ranges, _ = spans(path)
    marks = in_step(steps, ranges)
    assert sorted(steps) == [3, 4] and "train/optimizer" in marks[3]
    # The ranges open when forward raised were ended by torch when the window closed at exit, after step 4 did
    s0, s1 = steps[4]
    assert [r[0] for r in sorted(ranges, key=lambda r: r[1]) if s0 <= r[1] <= s1 and r[0].startswith("train/")] == [
        "train/forward_backward", "train/forward"]


@pytest.mark.slow
def test_close_after_a_failed_train_writes_the_window_at_once(tmp_path):
    trainer, cb = train(tmp_path, cfg(tmp_path / "run", steps=[3, 4]), max_steps=6)
    fail_in_forward(trainer, 4)
    with pytest.raises(RuntimeError, match="boom in forward at step 4"):
        trainer.train()
    assert not (tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl").exists()  # HF told no callback
    cb.close()  # a notebook going on after the failure
    [rec] = manifest(tmp_path / "run")
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "exception"
    assert sorted(spans(trace_files(tmp_path / "run")[0])[0]) == [3, 4]
    assert not trainer.model._forward_pre_hooks  # our hooks are gone (the test's own forward hook stays)
    trainer, _ = train(tmp_path / "again", cfg(tmp_path / "again" / "run", steps=[1]), max_steps=2)
    trainer.train()  # torch's profiler is free again for the next run in this process
    assert [r["steps"] for r in manifest(tmp_path / "again" / "run")] == [[1, 1]]


def test_importing_distprof_does_not_import_transformers():
    code = "import sys, distprof, distprof.integrations; assert 'transformers' not in sys.modules, 'imported'"
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_torchrun_two_ranks_capture_the_same_steps(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", JOB, str(tmp_path), "ddp"], check=False, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    for rank in (0, 1):  # each process says once where its traces go, with no logging set up (distprof.util.logs)
        assert proc.stderr.count(f"[distprof main rank {rank}] traces go to {run}/main/rank{rank:05d};") == 1
    for rank in (0, 1):
        [rec] = manifest(run, rank=rank)
        assert rec["steps"] == [3, 4] and rec["world_size"] == 2 and rec["complete"] is True
        [path] = trace_files(run / "main" / f"rank{rank:05d}")
        steps, ranges, events = spans(path)
        assert sorted(steps) == [3, 4]
        assert load_trace(path)["distributedInfo"]["rank"] == rank
        assert PHASES <= {r[0] for r in ranges}
        # DDP's gradient all-reduce runs during backward
        backward = [r for r in ranges if r[0] == "train/backward"]
        allreduce = [op for e, op in ops(events) if e["name"] == "c10d::allreduce_"]
        assert allreduce and all(any(within(a, b) for b in backward) for a in allreduce)
    code, _, _ = cli("check", run, "--json")
    assert code == 0
    code, out, _ = cli("steps", run, "--json")
    assert code == 0 and [(s["step"], sorted(r["rank"] for r in s["ranks"])) for s in out["steps"]] == [
        (3, [0, 1]), (4, [0, 1])]
    assert all(PHASES <= set(r["phases"]) for s in out["steps"] for r in s["ranks"])
