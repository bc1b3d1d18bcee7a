"""slime's profiler flags over distprof: profile targets chosen on the command line, per rollout id.

slime picks what to profile with `--profile-target train_overall|train_actor|train_log_probs` and when with
`--profile-step-start/--profile-step-end` (rollout ids, end exclusive), `--use-pytorch-profiler`, and
`--tensorboard-dir` for the traces. The same flags, as a slime user passes them, configure distprof here:
each target is a Profiler role stepped once per rollout id, and the flags choose which one captures.

    python examples/slime_profile_targets.py OUT_DIR [slime flags ...]
"""

import sys

import torch

import distprof

DEFAULT_FLAGS = ["--use-pytorch-profiler", "--profile-step-start", "2", "--profile-step-end", "4",
                 "--profile-target", "train_log_probs", "--profile-ranks", "0"]


def main(out: str, flags: list[str]) -> None:
    config = distprof.ProfilerConfig.from_dialect("slime", [*flags, "--tensorboard-dir", out])
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    targets = {name: distprof.Profiler(config, role=name) for name in ("train_overall", "train_log_probs", "train_actor")}
    for prof in targets.values():
        prof.start()
    for rollout_id in range(5):
        batch = torch.randn(16, 32)
        with distprof.annotate("train/log_probs"):
            with torch.no_grad():
                model(batch).log_softmax(-1)
        targets["train_log_probs"].step()
        with distprof.annotate("train/actor"):
            model(batch).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        targets["train_actor"].step()
        targets["train_overall"].step()
    for name, prof in targets.items():
        prof.stop()
        if prof.windows_closed:
            print(f"{name}: {prof.save_dir}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or DEFAULT_FLAGS)
