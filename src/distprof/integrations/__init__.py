"""Trainer integrations: hf.DistprofCallback, lightning.DistprofProfiler; each imports its framework lazily."""
