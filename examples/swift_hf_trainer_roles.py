"""ms-swift's profiler over distprof: swift's arguments, an HF Trainer callback, and annotated stages.

ms-swift adds a profiler callback to its HF-based trainers from `--enable_profiler --profiler_steps
--profiler_ranks --profiler_contents --profiler_save_path`, and annotates stages of its trainers. Here the same
arguments configure distprof (`from_dialect("swift", ...)`), `DistprofCallback` drives it, and the loss is an
annotated stage, on a tiny GPT-2 built from a config (CPU, no download).

    python examples/swift_hf_trainer_roles.py OUT_DIR
"""

import sys

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import distprof
from distprof.integrations.hf import DistprofCallback


class Tokens(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 128, (16,))
        return {"input_ids": ids, "labels": ids}


@distprof.annotate("swift/compute_loss")
def compute_loss(outputs, labels, num_items_in_batch=None):
    logits = outputs.logits[:, :-1].flatten(0, 1)
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:].flatten())


def main(out: str) -> None:
    swift_args = {"enable_profiler": True, "profiler_save_path": f"{out}/profile", "profiler_steps": [2, 3],
                  "profiler_ranks": [0], "profiler_contents": ["cpu", "cuda"], "max_steps": 5}
    config = distprof.ProfilerConfig.from_dialect("swift", swift_args)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                       bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=f"{out}/hf", use_cpu=True, report_to=[], save_strategy="no",
                             max_steps=5, per_device_train_batch_size=2, disable_tqdm=True)
    callback = DistprofCallback(config)
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback],
            compute_loss_func=compute_loss).train()
    print(config.save_path)


if __name__ == "__main__":
    main(sys.argv[1])
