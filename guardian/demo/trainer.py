"""A small but genuine GRPO trainer on CPU that speaks verl 0.9.1's interface.

Same command line, files and step loop as verl's V1 ``fit``: rollout, old and reference log-probs, GRPO advantages,
PPO updates, checkpoint, validation every ``test_freq``, one metrics line, the rollout dump. Resuming from N logs
validation at N and trains from N+1. No signal handlers (as verl). Exit codes: 0 done, 1 config error or crash,
K for an injected crash.
"""

from __future__ import annotations

import os
import pprint
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from guardian.demo import checkpoint as ckpt
from guardian.demo.config import ConfigError, compose
from guardian.demo.metrics import (
    StepBatch,
    data_metrics,
    log_ppl,
    num_turns,
    timer,
    timing_metrics,
    validation_metrics,
)
from guardian.demo.optim import AdamW, ConstantWarmup, clip_grad_norm
from guardian.demo.overrides import OverrideError
from guardian.demo.policy import (
    Array,
    IntArray,
    MiniBatch,
    actor_loss,
    greedy,
    grpo_advantages,
    initial_params,
    masked_mean,
    sample,
    token_stats,
)
from guardian.demo.settings import Settings, from_tree
from guardian.demo.task import ALPHABET, PromptLoader, build_dataset, decode, load_reward_function, score_batch
from guardian.demo.writers import RolloutDumper, Tracking

TRANSIENT_MARKER = ".transient-fault-fired"
SLOW_SAVE_FILE = "slow_save.bin"  # what a slow save (+trainer.fault.slow_save_s) writes, a chunk at a time
SLOW_SAVE_CHUNK_S = 0.2


class Trainer:
    """verl V1's ``fit`` loop over the demo policy and task."""

    def __init__(self, settings: Settings) -> None:
        s = self.s = settings
        self.dataset = build_dataset()
        self.loader = PromptLoader(len(self.dataset), s.train_batch_size, s.data_seed)
        if self.loader.steps_per_epoch == 0:
            raise ConfigError(f"data.train_batch_size ({s.train_batch_size}) exceeds the dataset ({len(self.dataset)})")
        self.total_steps = s.total_training_steps or self.loader.steps_per_epoch * s.total_epochs
        self.params = initial_params(len(self.dataset), s.max_response_length)
        self.reference = initial_params(len(self.dataset), s.max_response_length)
        self.optimizer = AdamW(self.params, s.lr, s.betas, s.weight_decay)
        warmup = s.scheduler_warmup(self.total_steps)
        self.scheduler = ConstantWarmup(self.optimizer, warmup)
        print(f"Total steps: {self.total_steps}, num_warmup_steps: {warmup}", flush=True)
        self.rng = np.random.default_rng(s.rollout_seed)
        self.global_steps = 0
        self.checkpoints = ckpt.CheckpointManager(s.default_local_dir, s.max_actor_ckpt_to_keep)
        self.dumper = RolloutDumper() if s.rollout_data_dir else None
        self.reward_fn = load_reward_function(s.reward_fn_path, s.reward_fn_name) if s.reward_fn_path else None

    # -- checkpoints ------------------------------------------------------------------------------
    def _save(self) -> None:
        if self.s.faults.slow_save_s > 0:
            self._slow_save(self.s.faults.slow_save_s)
        rng_state = ckpt.pack_json(self.rng.bit_generator.state)
        actor = {
            "model": dict(self.params),
            "optimizer": self.optimizer.state_dict(),
            "extra": {"lr_scheduler": ckpt.pack_json(self.scheduler.state_dict()), "rng": rng_state},
        }
        hf = {
            "model_type": "guardian-demo-tabular",
            "vocab": [*ALPHABET, "<eos>"],
            "n_positions": self.s.max_response_length,
        }
        self.checkpoints.save(self.global_steps, self.s.save_contents, actor, self.loader.state_dict(), hf)

    def _slow_save(self, seconds: float) -> None:
        """A save that takes ``seconds``, its folder growing by a chunk every ``SLOW_SAVE_CHUNK_S``."""
        folder = Path(self.s.default_local_dir) / f"global_step_{self.global_steps}" / "actor"
        folder.mkdir(parents=True, exist_ok=True)
        end = time.monotonic() + seconds
        with open(folder / SLOW_SAVE_FILE, "ab") as out:
            while time.monotonic() < end:
                out.write(bytes(4096))
                out.flush()
                time.sleep(min(SLOW_SAVE_CHUNK_S, max(end - time.monotonic(), 0.0)))

    def _load(self) -> None:
        folder = ckpt.resume_folder(self.s.resume_mode, self.s.default_local_dir, self.s.resume_from_path)
        if folder is None:
            return
        self.global_steps = ckpt.step_of(folder)
        print(f"Resuming from {folder}, setting global step to {self.global_steps}", flush=True)
        loaded = ckpt.load_actor(folder, self.s.load_contents)
        if "model" in loaded:
            for name, value in loaded["model"].items():
                self.params[name][...] = value
        if "optimizer" in loaded:
            self.optimizer.load_state_dict(loaded["optimizer"])
        if "extra" in loaded:
            self.rng.bit_generator.state = ckpt.unpack_json(loaded["extra"]["rng"])
            self.scheduler.load_state_dict(ckpt.unpack_json(loaded["extra"]["lr_scheduler"]))
        data_state = ckpt.load_data_state(folder)
        if data_state is not None:
            self.loader.load_state_dict(data_state)

    # -- one step ---------------------------------------------------------------------------------
    def _score(self, prompt_ids: IntArray, tokens: IntArray, lengths: IntArray) -> tuple[Array, Array]:
        rows = [self.dataset[int(p)] for p in prompt_ids]
        return score_batch(rows, tokens, lengths, self.s.overlong, self.reward_fn)

    def _step(self, metrics: dict[str, object], timing: dict[str, float]) -> StepBatch:
        s = self.s
        with timer("gen", timing):
            batch_prompts = self.loader.next_batch()
            prompt_ids = np.repeat(batch_prompts, s.n)
            rollout = sample(self.params, prompt_ids, s.loss.temperature, self.rng)
            scores, _ = self._score(prompt_ids, rollout.tokens, rollout.lengths)
            groups = [str(uuid.UUID(bytes=self.rng.bytes(16), version=4)) for _ in batch_prompts]
        with timer("old_log_prob", timing):
            old_logp, entropy, _ = token_stats(self.params, prompt_ids, rollout.tokens, s.loss.temperature)
            metrics["actor/entropy"] = masked_mean(entropy, rollout.mask)
            metrics.update(log_ppl(old_logp, rollout.mask))
        ref_logp = None
        if s.loss.use_kl_loss:
            with timer("ref", timing):
                ref_logp = token_stats(self.reference, prompt_ids, rollout.tokens, s.loss.temperature)[0]
        with timer("adv", timing):
            group_ids = np.repeat(np.arange(batch_prompts.size), s.n)
            advantages = grpo_advantages(scores, group_ids, s.norm_adv_by_std)
        with timer("update_actor", timing):
            metrics.update(self._update(prompt_ids, rollout.tokens, rollout.mask, advantages, old_logp, ref_logp))
        uids = [f"{groups[g]}_{i % s.n}_0" for i, g in enumerate(group_ids)]
        return StepBatch(
            prompt_ids=prompt_ids,
            tokens=rollout.tokens,
            mask=rollout.mask,
            lengths=rollout.lengths,
            prompt_lengths=np.array([len(self.dataset[int(p)].text) for p in prompt_ids], dtype=np.int64),
            scores=scores,
            advantages=advantages,
            uids=uids,
            outputs=[decode(rollout.tokens[i], int(n)) for i, n in enumerate(rollout.lengths)],
        )

    def _update(
        self,
        prompt_ids: IntArray,
        tokens: IntArray,
        mask: Array,
        advantages: Array,
        old_logp: Array,
        ref_logp: Array | None,
    ) -> dict[str, float]:
        """PPO epochs over contiguous mini-batches (verl's ``actor.shuffle`` is false); LR steps once."""
        s = self.s
        rows = s.ppo_mini_batch_size * s.n
        sums: dict[str, list[float]] = {}
        for _ in range(s.ppo_epochs):
            for start in range(0, prompt_ids.size, rows):
                part = slice(start, start + rows)
                batch = MiniBatch(
                    prompt_ids[part],
                    tokens[part],
                    mask[part],
                    advantages[part],
                    old_logp[part],
                    None if ref_logp is None else ref_logp[part],
                )
                step_metrics, grads = actor_loss(self.params, batch, s.loss)
                grad_norm = clip_grad_norm(grads, s.clip_grad)
                if np.isfinite(grad_norm):
                    self.optimizer.step(grads)
                else:
                    print(f"WARN: grad_norm is not finite: {grad_norm}", flush=True)
                step_metrics["actor/grad_norm"] = grad_norm
                for key, value in step_metrics.items():
                    sums.setdefault(key, []).append(value)
        out = {key: float(np.mean(values)) for key, values in sums.items()}
        out["actor/lr"] = self.scheduler.step()
        return out

    def _validate(self) -> dict[str, object]:
        """Greedy decoding (verl's val_kwargs: temperature 0, n=1) over every prompt."""
        if self.s.faults.slow_validation_s > 0:
            time.sleep(self.s.faults.slow_validation_s)
        prompt_ids = np.arange(len(self.dataset), dtype=np.int64)
        tokens, lengths = greedy(self.params, prompt_ids)
        rewards, raw = self._score(prompt_ids, tokens, lengths)
        return validation_metrics(rewards, raw)

    # -- the loop ---------------------------------------------------------------------------------
    def _faults(self) -> None:
        f, step = self.s.faults, self.global_steps
        if f.transient and not self._first_strike(step):
            return
        if f.crash_at_step is not None and step == f.crash_at_step:
            print(
                f"RuntimeError: injected crash at step {step} (+trainer.fault.crash_at_step)",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            os._exit(f.exit_code)
        if f.hang_at_step is not None and step == f.hang_at_step:
            while True:
                time.sleep(3600)
        if f.nan_at_step is not None and step >= f.nan_at_step and np.isfinite(self.params["shared"][0, 0]):
            self.params["shared"][:, 0] = np.nan  # corrupt weights: every forward pass turns NaN from here on

    def _first_strike(self, step: int) -> bool:
        """A transient fault fires at most once per checkpoint dir: at its step, it leaves a marker there."""
        due = step in (self.s.faults.crash_at_step, self.s.faults.hang_at_step, self.s.faults.nan_at_step)
        marker = Path(self.s.default_local_dir) / TRANSIENT_MARKER
        if marker.exists():
            return False
        if due:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"transient fault fired at step {step}\n")
        return True

    def fit(self) -> None:
        s = self.s
        self._load()
        tracking = Tracking(s.project_name, s.experiment_name, s.loggers)
        for name in s.ignored_loggers:
            print(f"WARN: trainer.logger '{name}' is not available in the demo trainer; ignored", flush=True)
        try:
            if s.val_before_train:
                val = self._validate()
                pprint.pprint(f"Initial validation metrics: {val}")
                tracking.log(val, self.global_steps)
            steps_per_epoch = self.loader.steps_per_epoch
            epoch = self.global_steps // steps_per_epoch
            self.global_steps += 1
            last_val: dict[str, object] | None = None
            while epoch < s.total_epochs and self.global_steps <= self.total_steps:
                is_last = self.global_steps >= self.total_steps
                self._faults()
                metrics: dict[str, object] = {}
                timing: dict[str, float] = {}
                with timer("step", timing):
                    batch = self._step(metrics, timing)
                    if s.faults.slow_steps > 0:
                        time.sleep(s.faults.slow_steps)
                    if s.save_freq > 0 and (is_last or self.global_steps % s.save_freq == 0):
                        with timer("save_checkpoint", timing):
                            self._save()
                if s.test_freq > 0 and (is_last or self.global_steps % s.test_freq == 0):
                    with timer("testing", timing):
                        val = self._validate()
                    last_val = val if is_last else last_val
                    metrics.update(val)
                metrics["training/global_step"] = self.global_steps
                metrics["training/epoch"] = epoch
                metrics.update(data_metrics(batch))
                metrics.update(num_turns(batch.prompt_ids.size))
                metrics.update(timing_metrics(timing, batch))
                if self.dumper is not None and s.rollout_data_dir:
                    self._dump(batch, s.rollout_data_dir)
                tracking.log(metrics, self.global_steps)
                self.global_steps += 1
                epoch = (self.global_steps - 1) // steps_per_epoch
                if is_last:
                    pprint.pprint(f"Final validation metrics: {last_val}")
                    break
        finally:
            if self.dumper is not None:
                self.dumper.close()
            tracking.finish()

    def _dump(self, batch: StepBatch, directory: str) -> None:
        """V1's rollout dump: rows sorted by ``(group, sample, index)``; scores as float32 sums."""
        assert self.dumper is not None
        order = sorted(range(len(batch.uids)), key=lambda i: (batch.uids[i].rsplit("_", 2)[0], i))
        rows = [self.dataset[int(batch.prompt_ids[i])] for i in order]
        self.dumper.submit(
            [row.text for row in rows],
            [batch.outputs[i] for i in order],
            [row.code for row in rows],
            [float(np.float32(batch.scores[i])) for i in order],
            [batch.uids[i] for i in order],
            directory,
            self.global_steps,
        )


def main(argv: list[str] | None = None) -> int:
    """Compose the command line, print the config like verl, train; 1 on a configuration error."""
    args = sys.argv[1:] if argv is None else argv
    try:
        composed = compose(args)
        settings = from_tree(composed.tree)
        os.environ.update(settings.env_vars)
        pprint.pprint(composed.tree)
        for line in composed.warnings:
            print(line, flush=True)
        trainer = Trainer(settings)
    except (OverrideError, ConfigError) as exc:
        print(f"{exc}\n\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", file=sys.stderr)
        return 1
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
