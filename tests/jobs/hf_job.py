"""A tiny Hugging Face Trainer job profiled by DistprofCallback; imported by test_hf.py, run by it as a script.

    python tests/jobs/hf_job.py OUT ddp          under torchrun: every rank captures steps 3-4 (gloo DDP on CPU)
    python tests/jobs/hf_job.py OUT crash N      one process whose model raises inside forward at distprof step N
"""

import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

import distprof
from distprof.integrations.hf import DistprofCallback


class TokenData(Dataset):
    """``n`` fixed random token sequences; each is its own label (causal LM)."""

    def __init__(self, n=16, length=16):
        self.n, self.length = n, length

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.randint(0, 128, (self.length,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}


class Probe(TrainerCallback):
    """Marks HF's ``state.global_step`` in the trace as seen by on_step_begin and on_step_end (listed before
    DistprofCallback, so each mark lands in the distprof step whose callbacks see it); ``begun`` lists them all."""

    def __init__(self):
        self.begun = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begun.append(state.global_step)
        with distprof.annotate(f"probe/begin{state.global_step}"):
            pass

    def on_step_end(self, args, state, control, **kwargs):
        with distprof.annotate(f"probe/end{state.global_step}"):
            pass


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                      bos_token_id=0, eos_token_id=0))


def make_trainer(out, callback, max_steps=6, n=16, model=None, **targs):
    hf_logging.set_verbosity_error()  # HF's notes about this tiny model are not the test's business
    args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to=[], logging_steps=1, max_steps=max_steps,
                             per_device_train_batch_size=2, dataloader_num_workers=0, disable_tqdm=True,
                             **{"save_strategy": "no", **targs})
    return Trainer(model=model or tiny_model(), args=args, train_dataset=TokenData(n),
                   callbacks=[Probe(), callback])


def fail_in_forward(trainer, step):
    """Make the model raise halfway through its forward (inside train/forward) at distprof step ``step``."""

    def fail(module, inputs, output):
        if trainer.state.global_step == step:
            raise RuntimeError(f"boom in forward at step {step}")

    trainer.model.transformer.h[0].register_forward_hook(fail)


def main(argv):
    out, mode = argv[0], argv[1]
    config = {"enable": True, "save_path": f"{out}/run", "steps": [3, 4], "torch": {"activities": ["cpu"]}}
    if mode == "ddp":
        trainer = make_trainer(f"{out}/hf", DistprofCallback({**config, "ranks": "all"}), max_steps=5,
                               ddp_backend="gloo")
        trainer.train()
    elif mode == "crash":
        fail_at = int(argv[2])
        trainer = make_trainer(f"{out}/hf", DistprofCallback(config))
        fail_in_forward(trainer, fail_at)
        trainer.train()
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
