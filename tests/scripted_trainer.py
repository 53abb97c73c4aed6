"""A trainer whose metrics follow a script, for rescues whose outcome a test decides.

    python tests/scripted_trainer.py trainer.default_local_dir=DIR trainer.total_training_steps=N \
        trainer.save_freq=K actor_rollout_ref.actor.entropy_coeff=C +script.fixed_reward=R [resume keys]

It speaks the part of verl's interface the guardian relies on: Hydra-style ``key=value`` arguments, the
``file`` logger's JSONL at ``$VERL_FILE_LOGGER_PATH`` (truncated on every start), ``global_step_N``
folders with ``latest_checkpointed_iteration.txt`` written after them, ``trainer.resume_mode=resume_path``
with the validation-only line at the resume step. While ``entropy_coeff`` is negative it learns for 15
steps (reward 0.1 -> 0.5) and then collapses (entropy -25 % a step, reward flat); a run resumed with a
non-negative coefficient holds its entropy and scores ``+script.fixed_reward`` - above or below the
rollback point's level, as the test wants. ``+script.detached_child=FILE``: each launch first starts a child in
a session of its own (``setsid``, as a daemon or a Ray instance would) that outlives the trainer, and appends its
pid to FILE. Like verl's TaskRunner, it prints its config (its arguments as one nested dict, ``pprint``-ed) first.
"""

from __future__ import annotations

import json
import math
import os
import pprint
import subprocess
import sys
import time
from pathlib import Path

LEARN_STEPS = 15


def main(argv: list[str]) -> int:
    args = dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)
    print_config(args)
    ckpt = Path(args["trainer.default_local_dir"])
    total = int(args["trainer.total_training_steps"])
    save_freq = int(args.get("trainer.save_freq", "5"))
    fixed = float(args.get("actor_rollout_ref.actor.entropy_coeff", "0")) >= 0
    fixed_reward = float(args.get("script.fixed_reward", "0.5"))
    start = 0
    if args.get("trainer.resume_mode") == "resume_path":
        start = int(args["trainer.resume_from_path"].rsplit("global_step_", 1)[1])
    if "script.detached_child" in args:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open(args["script.detached_child"], "a") as pids:
            pids.write(f"{child.pid}\n")
    log = open(os.environ["VERL_FILE_LOGGER_PATH"], "wb", buffering=0)  # noqa: SIM115 - verl truncates too
    if start:
        log.write(json.dumps({"step": start, "data": {"val-aux/num_turns/mean": 2.0}}).encode() + b"\n")
    entropy_at_start = entropy_of(start)
    for step in range(start + 1, total + 1):
        wiggle = 0.01 * math.sin(1.7 * step)  # deterministic batch noise
        if fixed:
            entropy, reward = entropy_at_start * (1 + wiggle), fixed_reward + wiggle
        else:
            entropy, reward = entropy_of(step), 0.1 + 0.4 * min(step, LEARN_STEPS) / LEARN_STEPS + wiggle
        data = {
            "actor/entropy": entropy,
            "critic/score/mean": reward,
            "critic/score/max": 1.0,
            "critic/score/min": 0.0,
            "actor/grad_norm": 0.5,
            "actor/lr": 1e-6,
            "timing_s/step": 0.02,
            "training/global_step": step,
        }
        if step % save_freq == 0:
            folder = ckpt / f"global_step_{step}" / "actor"
            folder.mkdir(parents=True, exist_ok=True)
            (ckpt / "latest_checkpointed_iteration.txt").write_text(str(step))
        log.write(json.dumps({"step": step, "data": data}).encode() + b"\n")
        time.sleep(0.02)
    return 0


def print_config(args: dict[str, str]) -> None:
    """The arguments as verl prints its composed config: one nested dict, values read as JSON where they parse."""
    tree: dict[str, object] = {}
    for key, text in args.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            child = node.get(part)
            node[part] = child = child if isinstance(child, dict) else {}
            node = child
        try:
            node[leaf] = json.loads(text)
        except ValueError:
            node[leaf] = text
    pprint.pprint(tree)
    sys.stdout.flush()


def entropy_of(step: int) -> float:
    """2.0 falling gently while the run learns, then 25 % a step."""
    if step <= LEARN_STEPS:
        return 2.0 - 0.02 * step
    return (2.0 - 0.02 * LEARN_STEPS) * 0.75 ** (step - LEARN_STEPS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
