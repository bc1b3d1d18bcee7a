"""On-demand capture (`distprof trigger`): a real gloo job, in-process profilers on real torch.profiler, fsspec
storage (memory:// and a real S3 server on loopback), the CLI as a subprocess."""

import json
import os
import subprocess
import sys
import time
from functools import partial

import msgspec
import pytest
import torch
from conftest import JOBS, config
from tracekit import cli, load

import distprof
from distprof import Profiler, ProfilerConfig
from distprof.analysis.check import check_run
from distprof.capture.profiler import IDLE
from distprof.capture.trigger import RequestStore, make_request
from distprof.config.model import ConfigError
from distprof.rundir.store import manifest_records

cfg = partial(config, run=None, typed=False, enable=None, trigger=True, trigger_poll_s=0, ranks="all")


def work():
    with distprof.annotate("train/compute"):
        torch.randn(16, 16) @ torch.randn(16, 16)


def run_to(prof, step):
    while prof.global_step < step:
        work()
        prof.step()


def profiler_steps(path):
    return sorted(int(e["name"].split("#")[1]) for e in load(path)["traceEvents"]
                  if e.get("name", "").startswith("ProfilerStep#"))


@pytest.mark.slow
def test_gloo_job_captures_the_same_steps_on_both_ranks_on_request(tmp_path):
    run_dir, started = tmp_path / "run", tmp_path / "started"
    env = {**os.environ, "DISTPROF_TRIGGER": "1"}  # the job opts in from the environment, its code unchanged
    job = subprocess.Popen([sys.executable, os.path.join(JOBS, "trigger_job.py"), str(run_dir), str(started), "20000"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not started.exists():  # waiting for the job to be running, not for it to reach some step
            assert job.poll() is None, job.communicate()[1][-3000:]
            time.sleep(0.02)
        # Running, opted in, nothing requested yet: no default window, no rank folder.
        assert not (run_dir / "train" / "rank00000").exists() and not (run_dir / "train" / "rank00001").exists()
        code, sent, err = cli("trigger", run_dir, "--steps", "2", "--json")
        assert code == 0, err
        assert sent["new"] is True
        code, again, _ = cli("trigger", run_dir, "--steps", "2", "--json")  # the same request again: one request
        assert code == 0 and again["id"] == sent["id"] and again["new"] is False
        out, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err[-3000:]
    rid = sent["id"]
    records = sorted(manifest_records(str(run_dir)), key=lambda r: r.rank)
    assert [(r.rank, r.trigger) for r in records] == [(0, rid), (1, rid)]  # one window each: the requested one
    first, last = records[0].steps
    assert records[1].steps == [first, last] and last == first + 1 and first % 10 == 0  # same aligned global steps
    for r in records:
        assert r.complete and profiler_steps(run_dir / r.files[0].path) == [first, last]
    assert len(os.listdir(run_dir / ".requests")) == 3  # one request (+ its start claim, acks): sent twice, stored once
    code, st, err = cli("trigger", run_dir, "--status", "--id", rid, "--json")
    assert code == 0, err
    (req,) = st["requests"]
    assert req["done"] and req["start_step"] == first
    assert [(a["rank"], a["state"], a["steps"]) for a in req["acks"]] == [(0, "captured", [first, last]),
                                                                         (1, "captured", [first, last])]
    code, text, _ = cli("trigger", run_dir, "--status")
    assert code == 0 and "captured" in text and rid in text
    checked = check_run(str(run_dir))  # requested windows are checked like planned ones
    assert checked.ok and [(i.rank, i.status, i.detail) for i in checked.items] == [
        (0, "ok", f"on demand (request {rid})"), (1, "ok", f"on demand (request {rid})")]


def test_a_rank_that_sees_the_request_after_the_agreed_start_skips_and_says_so(tmp_path):
    p0 = Profiler(cfg(tmp_path), role="train", rank=0, world_size=2).start()
    run_to(p0, 3)
    rid = distprof.trigger(str(tmp_path), steps=2)
    run_to(p0, 4)  # p0 saw it about to run step 4: start = first multiple of 10 >= 4 + 5
    # Rank 1 (resumed late, or slow to poll) first looks at step 12: after the agreed start 10.
    p1 = Profiler(cfg(tmp_path), role="train", rank=1, world_size=2, global_step=12).start()
    run_to(p0, 13)
    run_to(p1, 13)
    p0.stop(), p1.stop()
    acks = {a["rank"]: a for a in distprof.trigger_status(str(tmp_path), rid)["requests"][0]["acks"]}
    assert acks[0]["state"] == "captured" and acks[0]["steps"] == [10, 11]
    assert acks[1]["state"] == "skipped" and acks[1]["seen_step"] == 12
    assert acks[1]["detail"] == "saw the request at step 12, after the agreed start 10"
    recs = {r.rank: r for r in manifest_records(str(tmp_path))}
    assert recs[0].trigger == rid and recs[0].files and recs[0].steps == [10, 11]
    assert (recs[1].trigger, recs[1].stopped_by, recs[1].files, recs[1].complete) == (rid, "trigger_skipped", [], False)
    checked = check_run(str(tmp_path))
    assert checked.ok and [(i.rank, i.status) for i in checked.items] == [(0, "ok")]
    assert checked.notes == [f"train rank 1: skipped requested steps 10-11 (request {rid}, trigger_skipped)"]


def test_requests_over_the_budget_or_with_unknown_flags_are_refused(tmp_path):
    p = Profiler(cfg(tmp_path, trigger_max_steps=3), role="train").start()
    # The CLI refuses what the job's recorded config would refuse, before anything is stored.
    code, _, err = cli("trigger", tmp_path, "--steps", "4")
    assert code == 2 and "trigger_max_steps" in err
    code, _, err = cli("trigger", tmp_path, "--steps", "2", "--flags", "with_stack,record_everything")
    assert code == 2 and "record_everything" in err
    assert not (tmp_path / ".requests").exists()
    # A request that got there another way (an older job's limit, a hand-written file) is refused by the process.
    store = RequestStore(str(tmp_path))
    store.put(big := make_request(steps=4))
    store.put(cuda := make_request(steps=1, backend="cuda_memory"))
    run_to(p, 3)
    p.stop()
    acks = {r["id"]: r["acks"] for r in distprof.trigger_status(str(tmp_path))["requests"]}
    assert [(a["state"], "trigger_max_steps=3" in a["detail"]) for a in acks[big.id]] == [("refused", True)]
    assert [a["state"] for a in acks[cuda.id]] == ["refused"]  # no CUDA on this machine
    assert "CUDA" in acks[cuda.id][0]["detail"]
    assert manifest_records(str(tmp_path)) == []  # nothing captured
    code, st, _ = cli("trigger", tmp_path, "--status", "--wait", "30", "--json")  # every answer is final: no wait
    assert code == 0 and all(r["done"] for r in st["requests"])
    store.put(make_request(steps=1, tag="nobody is listening"))
    code, st, _ = cli("trigger", tmp_path, "--status", "--wait", "0", "--json")  # one request has no answer yet
    assert code == 1 and [r["done"] for r in st["requests"]].count(False) == 1


def test_ranks_and_roles_select_and_flags_reach_torch(tmp_path):
    actor0 = Profiler(cfg(tmp_path), role="actor", rank=0, world_size=2).start()
    actor1 = Profiler(cfg(tmp_path), role="actor", rank=1, world_size=2).start()
    ref0 = Profiler(cfg(tmp_path), role="ref", rank=0, world_size=2).start()
    rid = distprof.trigger(str(tmp_path), steps=1, ranks="0", roles=["act*"], flags="record_shapes", align=1,
                           lead_steps=1)
    for _ in range(4):
        for p in (actor0, actor1, ref0):
            work()
            p.step()
    for p in (actor0, actor1, ref0):
        p.stop()
    (req,) = distprof.trigger_status(str(tmp_path))["requests"]
    assert [(a["role"], a["rank"], a["state"]) for a in req["acks"]] == [("actor", 0, "captured")]
    (rec,) = manifest_records(str(tmp_path))
    assert (rec.role, rec.rank, rec.trigger, rec.steps) == ("actor", 0, rid, [2, 2])
    shapes = [e for e in load(tmp_path / rec.files[0].path)["traceEvents"]
              if e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {})]
    assert shapes  # record_shapes was on for this window only


def test_opting_in_without_a_request_captures_nothing_and_polls_by_the_clock(tmp_path):
    p = Profiler(cfg(tmp_path, trigger_poll_s=3600), role="train").start()
    assert p._fast == IDLE  # nothing planned: the idle fast path
    distprof.trigger(str(tmp_path), steps=1, align=1, lead_steps=0)
    run_to(p, 50)  # within the hour between polls: the request is not looked at, however many steps run
    assert distprof.trigger_status(str(tmp_path))["requests"][0]["acks"] == []
    assert p._poll_timer is not None and p._poll_timer._thread.is_alive()
    p._poll_timer.fire()  # what the poll timer does every trigger_poll_s (an hour here)
    run_to(p, 53)
    p.stop()
    assert [a["state"] for a in distprof.trigger_status(str(tmp_path))["requests"][0]["acks"]] == ["captured"]
    assert [r.steps for r in manifest_records(str(tmp_path))] == [[51, 51]]
    assert not p._fast  # stopped: the idle path is gone, and the timer with it
    assert p._poll_timer is None
    assert sorted(os.listdir(tmp_path)) == [".requests", "run.json", "train"]


def test_a_job_without_trigger_ignores_requests_and_a_restarted_rank_does_not_capture_twice(tmp_path):
    plain = Profiler({**cfg(tmp_path), "trigger": False, "enable": True, "steps": [100]}, role="train").start()
    rid = distprof.trigger(str(tmp_path), steps=1, align=1, lead_steps=0)
    run_to(plain, 5)
    plain.stop()
    assert distprof.trigger_status(str(tmp_path), rid)["requests"][0]["acks"] == []
    first = Profiler(cfg(tmp_path), role="train").start()
    run_to(first, 5)
    first.stop()
    again = Profiler(cfg(tmp_path), role="train").start()  # the same rank, restarted: the request is answered
    run_to(again, 5)
    again.stop()
    assert len(manifest_records(str(tmp_path))) == 1


def test_memory_url_storage_and_profiler():
    url = "memory://trigger-test/run"
    p = Profiler(cfg(url), role="train", rank=0, world_size=2).start()
    p1 = Profiler(cfg(url), role="train", rank=1, world_size=2).start()
    from distprof.rundir.upload import uploader

    assert uploader().drain(60)  # run.json at a URL is written by the upload thread, not by start()
    rid = distprof.trigger(url, steps=1, ranks=[0], align=1, lead_steps=1)
    assert distprof.trigger(url, steps=1, ranks=[0], align=1, lead_steps=1) == rid
    run_to(p, 4), run_to(p1, 4)
    p.stop(), p1.stop()
    (req,) = distprof.trigger_status(url)["requests"]
    assert [(a["rank"], a["state"], a["steps"]) for a in req["acks"]] == [(0, "captured", [2, 2])]
    store = RequestStore(url)
    assert store.claim_start("x", 7) == 7 and store.claim_start("x", 9) == 7  # first writer wins


def test_s3_request_sent_by_the_cli_while_the_profiler_runs(s3):
    url = f"{s3}/run"
    p = Profiler(cfg(url), role="train").start()
    run_to(p, 2)
    code, sent, err = cli("trigger", url, "--steps", "2", "--align", "1", "--lead-steps", "1", "--json")
    assert code == 0, err
    run_to(p, 8)
    p.stop()
    code, st, err = cli("trigger", url, "--status", "--json")
    assert code == 0, err
    (ack,) = st["requests"][0]["acks"]
    assert ack["state"] == "captured" and ack["id"] == sent["id"]
    assert ack["steps"][1] - ack["steps"][0] == 1 and ack["steps"][0] >= 3


def test_bad_requests_and_configs_name_the_field():
    for kw, word in [({"steps": 0}, "steps"), ({"steps": 2, "backend": "nsys"}, "backend"),
                     ({"steps": 2, "ranks": "x"}, "ranks"), ({"steps": 2, "align": 0}, "align"),
                     ({"steps": 2, "flags": ["with_stack"], "backend": "cuda_memory"}, "flags")]:
        with pytest.raises(ValueError, match=word):
            make_request(**kw)
    assert make_request(steps=2, flags="with_stack,record_shapes").id == make_request(
        steps=2, flags=["record_shapes", "with_stack"]).id  # the id is the content, not how it was spelled
    assert make_request(steps=2).id != make_request(steps=2, tag="again").id
    with pytest.raises(ConfigError, match="trigger_max_steps"):
        ProfilerConfig(trigger=True, save_path="/tmp/x", trigger_max_steps=0)
    with pytest.raises(ConfigError, match="trigger=True needs backend torch"):
        ProfilerConfig(trigger=True, save_path="/tmp/x", backend="nsys")
    with pytest.raises(ConfigError, match="save_path"):
        ProfilerConfig(trigger=True)
    assert ProfilerConfig(trigger=True, save_path="/tmp/x").plan().describe() == "on demand only (trigger)"


def test_cli_refuses_what_is_not_a_run_directory(tmp_path):
    code, _, err = cli("trigger", tmp_path, "--steps", "2")
    assert code == 2 and "not a distprof run directory" in err
    code, _, err = cli("trigger", tmp_path, "--status")
    assert code == 2 and "not a distprof run directory" in err
    (tmp_path / ".requests").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"config": {"trigger": True}}))
    (tmp_path / ".requests" / "junk.json").write_bytes(b"\x00not json")  # untrusted: skipped, not a traceback
    code, st, err = cli("trigger", tmp_path, "--status", "--json")
    assert code == 0 and st["requests"] == []
    forged = make_request(steps=1)
    (tmp_path / ".requests" / "0123456789abcdef.json").write_bytes(msgspec.json.encode(forged))  # id != its name
    code, st, err = cli("trigger", tmp_path, "--status", "--json")
    assert code == 0 and st["requests"] == []
    code, _, err = cli("trigger", tmp_path, "--status", "--id", "../run")  # ids name files: only ids are taken
    assert code == 2 and "no trigger request" in err
    code, _, err = cli("trigger", tmp_path)
    assert code == 2 and "--steps" in err


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on a 2-core machine
def test_ray_demo_captures_on_request_through_the_groups(tmp_path):
    from conftest import shared_ray

    from distprof.demo import rl_job
    from distprof.integrations.ray import trigger_all

    shared_ray()  # the suite's cluster: the demo runs on a session it finds connected

    answers = []

    def after_step(step, groups):
        if step == 0:  # sent while the job runs, between two of its steps, through Ray (no shared filesystem)
            answers.append(trigger_all(groups, steps=2, roles=["actor", "rollout"]))
            answers.append(trigger_all(groups, steps=50, roles=["ref"]))  # over trigger_max_steps (20)

    out = tmp_path / "demo"
    res = rl_job.run(str(out), steps=6, slow_ms=0, on_demand=True, after_step=after_step)
    ok, big = answers
    start = ok["start_step"]
    assert start == 3  # every worker was about to run step 1; 2 steps of lead
    assert {role: {r: a["state"] for r, a in per.items()} for role, per in ok["acks"].items()} == {
        "actor": {0: "accepted", 1: "accepted"}, "rollout": {0: "accepted"}}
    assert big["acks"] == {"ref": {0: big["acks"]["ref"][0]}} and big["acks"]["ref"][0]["state"] == "refused"
    got = sorted((f["role"], f["rank"], tuple(f["steps"]), f["trigger"]) for f in res.files)
    assert got == [("actor", 0, (3, 4), ok["id"]), ("actor", 1, (3, 4), ok["id"]), ("rollout", 0, (3, 4), ok["id"])]
    for f in res.files:
        assert profiler_steps(out / f["files"][0]["path"]) == [3, 4]
    # The acknowledgements came back with the files (collect): status reads them in the run directory.
    st = {r["id"]: r for r in distprof.trigger_status(str(out))["requests"]}
    assert [(a["role"], a["rank"], a["state"]) for a in st[ok["id"]]["acks"]] == [
        ("actor", 0, "captured"), ("actor", 1, "captured"), ("rollout", 0, "captured")]
    assert [(a["role"], a["state"]) for a in st[big["id"]]["acks"]] == [("ref", "refused")]
    assert res.check.ok


@pytest.mark.slow
def test_hf_trainer_that_opted_in_captures_on_request(tmp_path):
    from hf_job import make_trainer
    from transformers import TrainerCallback

    from distprof.integrations.hf import DistprofCallback

    run = tmp_path / "run"
    sent = []

    class Sender(TrainerCallback):  # another process would run `distprof trigger`; here, between two steps
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                sent.append(distprof.trigger(str(run), steps=2, align=1, lead_steps=1))

    trainer = make_trainer(tmp_path / "hf", DistprofCallback(cfg(run)), max_steps=8)
    trainer.add_callback(Sender())  # after DistprofCallback: the request lands once step 2 has ended
    trainer.train()
    (rec,) = manifest_records(str(run))
    assert (rec.trigger, rec.steps, rec.complete) == (sent[0], [4, 5], True)  # seen at step 3, one step of lead
    assert profiler_steps(run / rec.files[0].path) == [4, 5]


def test_lightning_trainer_that_opted_in_captures_on_request(tmp_path):
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from distprof.integrations.lightning import DistprofProfiler

    run = tmp_path / "run"
    sent = []

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Sender(pl.Callback):  # another process would run `distprof trigger`; here, between two batches
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2 and not sent:
                sent.append(distprof.trigger(str(run), steps=2, align=1, lead_steps=2))

    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=9, profiler=DistprofProfiler(cfg(run)), logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path), callbacks=[Sender()])
    trainer.fit(Tiny(), data)
    (rec,) = manifest_records(str(run))
    assert rec.trigger == sent[0] and rec.complete and rec.steps[1] == rec.steps[0] + 1
    assert profiler_steps(run / rec.files[0].path) == rec.steps
