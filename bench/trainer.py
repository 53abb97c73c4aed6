"""Demo-trainer benchmark: how long 300 steps of ``python -m guardian.demo.trainer`` take on CPU.

    python bench/trainer.py [--steps 300] [--scenario healthy] [--json]

1. Full run: the named scenario through its command line in a fresh subprocess (interpreter start,
   config, validation, 300 steps of rollout + old/ref log-probs + GRPO + PPO updates, the ``file``
   logger, rollout dumps, checkpoints), wall clock.
2. Baseline, measured in the same invocation: the same number of steps of rollout alone - sampling
   the same batch size x ``rollout.n`` responses and scoring them, no update, no writers - in process.
   The ratio (full / baseline) says how much the trainer adds on top of generating its data.

Target: 300 steps in under 30 s on 2 CPU cores. No assertion: the figures are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from guardian.demo import scenarios
from guardian.demo.config import compose
from guardian.demo.policy import sample
from guardian.demo.settings import from_tree
from guardian.demo.trainer import Trainer

TARGET_SECONDS = 30.0


def full_run(scenario: scenarios.Scenario, root: Path) -> float:
    files = scenarios.RunFiles(root)
    root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(files.console, "wb") as log:
        code = subprocess.run(
            scenario.command(files), env=scenario.environment(files), cwd=root, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    elapsed = time.perf_counter() - start
    if code != scenario.expected_exit_code:
        sys.exit(f"scenario {scenario.name} exited with {code}; see {files.console}")
    return elapsed


def baseline(scenario: scenarios.Scenario, root: Path, steps: int) -> float:
    """``steps`` rollouts (sample + score) with the scenario's settings and no update."""
    files = scenarios.RunFiles(root)
    settings = from_tree(compose(scenario.arguments(files)).tree)
    trainer = Trainer(settings)
    start = time.perf_counter()
    for _ in range(steps):
        prompts = np.repeat(trainer.loader.next_batch(), settings.n)
        rollout = sample(trainer.params, prompts, settings.loss.temperature, trainer.rng)
        trainer._score(prompts, rollout.tokens, rollout.lengths)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--scenario", default="healthy", choices=sorted(scenarios.SCENARIOS))
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    scenario = scenarios.get(args.scenario).with_extra(f"trainer.total_training_steps={args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        full = full_run(scenario, Path(tmp) / "full")
        with open(os.devnull, "w") as quiet:
            saved, sys.stdout = sys.stdout, quiet
            try:
                base = baseline(scenario, Path(tmp) / "baseline", args.steps)
            finally:
                sys.stdout = saved
    result = {
        "scenario": args.scenario,
        "steps": args.steps,
        "cpus": os.cpu_count(),
        "full_run_s": round(full, 2),
        "ms_per_step": round(1000 * full / args.steps, 1),
        "baseline_rollout_only_s": round(base, 2),
        "ratio_full_to_baseline": round(full / base, 1),
        "target_s": TARGET_SECONDS,
    }
    if args.json:
        print(json.dumps(result))
        return
    per_step = result["ms_per_step"]
    print(f"demo trainer, scenario {args.scenario}: {args.steps} steps in {full:.1f} s wall ({per_step} ms/step)")
    print(f"  target: under {TARGET_SECONDS:.0f} s on 2 CPU cores ({os.cpu_count()} here)")
    print(f"  baseline, same invocation: {args.steps} steps of rollout + scoring only, in process: {base:.2f} s")
    print(f"  ratio full / baseline: {full / base:.1f}x")


if __name__ == "__main__":
    main()
