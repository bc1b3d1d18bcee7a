"""A tiny Lightning job profiled by DistprofProfiler; run by tests/test_lightning.py as a real child process.

    python lightning_job.py SAVE_PATH DEVICES

With DEVICES=2, ``strategy="ddp"`` makes Lightning launch the second rank itself (it runs this script again
with LOCAL_RANK=1); the ranks talk over gloo on CPU. Every rank profiles global steps 2-3 (``ranks: all``).
"""

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from distprof.integrations.lightning import DistprofProfiler

SAVE, DEVICES = sys.argv[1], int(sys.argv[2])


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    config = {"enable": True, "save_path": SAVE, "ranks": "all", "steps": [2, 3], "torch": {"activities": ["cpu"]}}
    trainer = pl.Trainer(accelerator="cpu", devices=DEVICES, strategy="ddp" if DEVICES > 1 else "auto", max_steps=5,
                         profiler=DistprofProfiler(config), logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    print(f"rank {trainer.global_rank} finished at global step {trainer.global_step}", flush=True)
