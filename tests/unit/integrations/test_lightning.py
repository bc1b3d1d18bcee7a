"""DistprofProfiler with a real PyTorch Lightning Trainer (CPU): steps, phases, accumulation, stages, faults, DDP."""

import logging
import os
import pickle
import subprocess
import sys
from functools import partial

import lightning.pytorch as pl
import msgspec
import pytest
import torch
from conftest import JOBS, config, load_trace, trace_files
from torch.utils.data import DataLoader, TensorDataset
from tracekit import cli

import distprof
from distprof.capture import shutdown
from distprof.integrations.lightning import DistprofProfiler, phase_name

PHASES = {"lightning/training_step", "lightning/backward", "lightning/optimizer_step",
          "lightning/train_dataloader_next", "lightning/run_training_batch"}

pytestmark = pytest.mark.filterwarnings(  # Lightning's advice about this tiny job, not about distprof
    "ignore:You defined a `validation_step`", "ignore:.*LeafSpec", "ignore:You're resuming from a checkpoint")


class Tiny(pl.LightningModule):
    """Records the global step each batch sees and marks each batch in the trace as ``batch{i}``."""

    def __init__(self, fail_at=None, on_batch=None):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.seen = []  # (trainer.global_step inside training_step, batch_idx)
        self.fail_at, self.on_batch = fail_at, on_batch

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        self.seen.append((self.global_step, batch_idx))
        if self.global_step == self.fail_at:
            raise RuntimeError("boom in training_step")
        if self.on_batch:
            self.on_batch(self)
        with distprof.annotate(f"batch{batch_idx}"):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)), batch_size=4)


def trainer(tmp_path, profiler, **kw):
    base = {"accelerator": "cpu", "devices": 1, "max_steps": 5, "profiler": profiler, "logger": False,
            "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
            "default_root_dir": str(tmp_path)}
    base.update(kw)
    return pl.Trainer(**base)


cfg = partial(config, typed=False)


def manifest(root, role="main", rank=0):
    p = os.path.join(root, role, f"rank{rank:05d}", "manifest.jsonl")
    with open(p, "rb") as f:
        return [msgspec.json.decode(line) for line in f.read().splitlines()]


def steps_of(events):
    """{N: (start, end)} of each ProfilerStep#N."""
    return {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
            for e in events if e.get("name", "").startswith("ProfilerStep#")}


def inside(events, span, prefix):
    """Names of user annotations starting with ``prefix`` that lie in ``span``."""
    return sorted(e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(prefix)
                  and span[0] <= e["ts"] and e["ts"] + e["dur"] <= span[1])


def assert_no_range_left_open():
    state = sys.modules["distprof.capture.annotate"]
    assert state._STATE.opened == 0 and not state._tls.__dict__.get("stack")
    assert shutdown._started == []  # the profiler was stopped, nothing left for exit time


def test_phase_names_keep_the_action_recognisable():
    assert phase_name("[Strategy]DDPStrategy.training_step") == "lightning/training_step"
    assert phase_name("[Strategy]SingleDeviceStrategy.backward") == "lightning/backward"
    assert phase_name("[LightningModule]Tiny.optimizer_step") == "lightning/optimizer_step"
    assert phase_name("[_TrainingEpochLoop].train_dataloader_next") == "lightning/train_dataloader_next"
    assert phase_name("[_EvaluationLoop].val_next") == "lightning/val_next"
    assert phase_name("run_training_batch") == "lightning/run_training_batch"
    assert phase_name("optimizer_step") == "lightning/optimizer_step"  # manual optimization's action
    assert (phase_name("[Callback]ModelCheckpoint{'monitor': None, 'dirpath': '/a.b/c'}.on_train_batch_end")
            == "lightning/callback/ModelCheckpoint.on_train_batch_end")
    assert phase_name("[Callback]TQDMProgressBar.on_train_start") == "lightning/callback/TQDMProgressBar.on_train_start"
    assert phase_name("run_training_epoch") is None  # spans steps: no phase of one


@pytest.mark.parametrize("accumulate", [1, 2])
def test_profiler_step_n_is_lightning_global_step_n(tmp_path, caplog, accumulate):
    """steps [2,3] -> one trace; ProfilerStep#N holds exactly the batches whose training_step saw global_step N
    (with accumulate_grad_batches=k: batches k*N .. k*N+k-1); Lightning's actions are phases in it."""
    caplog.set_level(logging.INFO, logger="lightning.pytorch.profilers.profiler")
    module = Tiny()
    prof = DistprofProfiler(cfg(tmp_path, steps=[2, 3]))
    t = trainer(tmp_path, prof, accumulate_grad_batches=accumulate)
    t.fit(module, loader())
    assert t.global_step == 5

    run = tmp_path / "run"
    files = trace_files(run)
    assert [os.path.relpath(f, run) for f in files] == ["main/rank00000/step00000002-00000003.pt.trace.json.gz"]
    events = load_trace(files[0])["traceEvents"]
    steps = steps_of(events)
    assert sorted(steps) == [2, 3]
    for n, span in steps.items():
        expected = sorted(f"batch{i}" for g, i in module.seen if g == n)
        assert expected == sorted(f"batch{i}" for i in range(accumulate * n, accumulate * n + accumulate))
        assert inside(events, span, "batch") == expected
        assert inside(events, span, "lightning/training_step") == ["lightning/training_step"] * accumulate
        assert inside(events, span, "lightning/backward") == ["lightning/backward"] * accumulate
        assert inside(events, span, "lightning/optimizer_step") == ["lightning/optimizer_step"]  # one per step
    assert PHASES <= {e["name"] for e in events if e.get("cat") == "user_annotation"}
    (line,) = manifest(run)
    assert line["steps"] == [2, 3] and line["complete"] is True
    assert f"1 window(s) in {run / 'main' / 'rank00000'}" in caplog.text  # describe() -> summary()
    assert_no_range_left_open()
    assert pickle.loads(pickle.dumps(prof)).config == prof.config  # ddp_spawn pickles the trainer's profiler

    if accumulate == 1:  # the analysis sees the phases per step
        code, out, err = cli("steps", run, "--json")
        assert code == 0, err
        assert [s["step"] for s in out["steps"]] == [2, 3]
        for s in out["steps"]:
            assert PHASES <= set(s["ranks"][0]["phases"])


def test_disabled_config_writes_nothing_and_trains(tmp_path):
    t = trainer(tmp_path, DistprofProfiler({"enable": False, "save_path": str(tmp_path / "run"), "steps": [1]}))
    t.fit(Tiny(), loader())
    assert t.global_step == 5
    assert not (tmp_path / "run").exists()
    assert_no_range_left_open()


def test_config_that_does_not_fit_the_job_is_reported_not_raised(tmp_path, caplog):
    """ranks [1] in a 1-process job: on_error="disable" logs why and trains on; "raise" stops fit with the reason."""
    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, ranks=[1], steps=[1])))
    with caplog.at_level(logging.ERROR, logger="distprof"):
        t.fit(Tiny(), loader())
    assert t.global_step == 5 and not (tmp_path / "run").exists()
    assert "ranks [1] do not exist: world size is 1" in caplog.text

    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, ranks=[1], steps=[1], on_error="raise")))
    with pytest.raises(ValueError, match=r"ranks \[1\] do not exist"):
        t.fit(Tiny(), loader())


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="save_path"):
        DistprofProfiler({"enable": True})
    with pytest.raises(ValueError, match=r"stages=\('train',\).*fit, validate, test, predict"):
        DistprofProfiler({"enable": False}, stages=("train",))
    with pytest.raises(ValueError, match="outside save_path"):
        DistprofProfiler({"enable": False}, role="../x")


def test_unmatched_and_nested_actions_never_leave_a_range_open(tmp_path):
    """stop() of an action never started is harmless; an action left open closes with the one enclosing it;
    a user's own ``trainer.profiler.profile(...)`` becomes a phase."""

    def on_batch(module):
        p = module.trainer.profiler
        p.stop("never started")
        p.start("left open")
        with p.profile("custom"):
            pass

    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[1, 2])))
    t.fit(Tiny(on_batch=on_batch), loader())
    assert t.global_step == 5
    (path,) = trace_files(tmp_path / "run")
    events = load_trace(path)["traceEvents"]
    by_name = {}
    for e in events:
        if e.get("cat") == "user_annotation":
            by_name.setdefault(e["name"], []).append((e["ts"], e["ts"] + e["dur"]))
    assert len(by_name["lightning/custom"]) == 2 and len(by_name["lightning/left open"]) == 2
    for (s, e), (ts, te) in zip(by_name["lightning/left open"], by_name["lightning/training_step"]):
        assert ts <= s and e <= te  # closed when training_step's action stopped
    assert sorted(steps_of(events)) == [1, 2]
    assert_no_range_left_open()


def test_failed_fit_writes_the_steps_it_captured(tmp_path):
    """training_step raises in global step 3 of window 2-4: fit raises the user's error, and the window is
    written at Lightning's on_exception with steps 2-3 (the failed step kept), marked incomplete."""
    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[2, 3, 4])), enable_model_summary=True)
    with pytest.raises(RuntimeError, match="boom in training_step"):
        t.fit(Tiny(fail_at=3), loader())
    run = tmp_path / "run"
    (line,) = manifest(run)
    assert line["steps"] == [2, 3] and line["complete"] is False and line["stopped_by"] == "exception"
    (path,) = trace_files(run)
    assert sorted(steps_of(load_trace(path)["traceEvents"])) == [2, 3]
    assert_no_range_left_open()


def test_resumed_fit_profiles_the_same_global_steps(tmp_path):
    """The profiler takes the step from the trainer after the checkpoint is restored."""
    first = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[3, 4])), max_steps=2)
    first.fit(Tiny(), loader())
    assert trace_files(tmp_path / "run") == []  # steps 0-1 ran: nothing to capture yet
    ckpt = str(tmp_path / "at2.ckpt")
    first.save_checkpoint(ckpt)

    module = Tiny()
    resumed = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[3, 4])), max_steps=5)
    resumed.fit(module, loader(), ckpt_path=ckpt)
    assert module.seen[0][0] == 2
    (path,) = trace_files(tmp_path / "run")
    assert os.path.basename(path) == "step00000003-00000004.pt.trace.json.gz"
    events = load_trace(path)["traceEvents"]
    for n, span in steps_of(events).items():
        assert inside(events, span, "batch") == sorted(f"batch{i}" for g, i in module.seen if g == n)
    assert sorted(steps_of(events)) == [3, 4]


def test_evaluation_stages_capture_nothing_by_default(tmp_path):
    module = Tiny()
    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[1, 2])))
    assert len(t.validate(module, loader(), verbose=False)) == 1
    assert len(t.test(module, loader(), verbose=False)) == 1
    assert len(t.predict(module, loader())) == 16
    assert not (tmp_path / "run").exists()  # default stages=("fit",): evaluation runs untouched
    assert_no_range_left_open()


@pytest.mark.parametrize("stage, hook", [("validate", "validation_step"), ("test", "test_step"),
                                         ("predict", "predict_step")])
def test_configured_evaluation_stage_counts_its_batches(tmp_path, stage, hook):
    t = trainer(tmp_path, DistprofProfiler(cfg(tmp_path, steps=[1, 2]), stages=(stage,)))
    kw = {} if stage == "predict" else {"verbose": False}
    assert getattr(t, stage)(Tiny(), loader(), **kw)
    run = tmp_path / "run"
    (path,) = trace_files(run)
    assert os.path.relpath(path, run) == f"main/{stage}/rank00000/step00000001-00000002.pt.trace.json.gz"
    events = load_trace(path)["traceEvents"]
    steps = steps_of(events)
    assert sorted(steps) == [1, 2]  # step N = the N-th batch (from 0) of this call
    for span in steps.values():
        assert inside(events, span, f"lightning/{hook}") == [f"lightning/{hook}"]
    assert_no_range_left_open()


def test_profiler_used_outside_a_trainer_fails_softly(tmp_path, caplog):
    """A fault in the glue (here: no trainer attached) is logged once and switches profiling off; with
    on_error="raise" it surfaces."""
    p = DistprofProfiler(cfg(tmp_path, steps=[0]))
    with caplog.at_level(logging.ERROR, logger="distprof"):
        p.setup("fit")
        p.start("run_training_batch")
        p.stop("run_training_batch")
        p.describe()
    assert caplog.text.count("profiling is off for the rest of the run") == 1
    assert not (tmp_path / "run").exists()

    p = DistprofProfiler(cfg(tmp_path, steps=[0], on_error="raise"))
    with pytest.raises(RuntimeError, match="did not attach"):
        p.setup("fit")


@pytest.mark.slow
def test_ddp_two_processes_each_write_their_rank(tmp_path):
    """strategy="ddp" on CPU (gloo), Lightning launching the second rank itself; ranks: all."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, os.path.join(JOBS, "lightning_job.py"), str(run), "2"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 0 finished at global step 5" in proc.stdout and "rank 1 finished at global step 5" in proc.stdout
    for rank in (0, 1):  # each process says once where its traces go, as the plain Profiler does (distprof.util.logs)
        assert proc.stderr.count(f"[distprof main rank {rank}] traces go to {run}/main/rank{rank:05d};") == 1
    files = [os.path.relpath(f, run) for f in trace_files(run)]
    assert files == [f"main/rank0000{r}/step00000002-00000003.pt.trace.json.gz" for r in (0, 1)]
    for rank, f in enumerate(files):
        events = load_trace(run / f)["traceEvents"]
        assert sorted(steps_of(events)) == [2, 3]
        assert "gloo:all_reduce" in {e.get("name") for e in events}  # DDP's gradient all-reduce was captured
        (line,) = manifest(run, rank=rank)
        assert (line["rank"], line["world_size"], line["steps"], line["complete"]) == (rank, 2, [2, 3], True)
    code, out, err = cli("steps", run, "--json")
    assert code == 0, err
    assert [(s["step"], sorted(r["rank"] for r in s["ranks"])) for s in out["steps"]] == [(2, [0, 1]), (3, [0, 1])]
