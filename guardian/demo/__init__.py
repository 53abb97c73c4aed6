"""A verl-compatible GRPO trainer on CPU (numpy only), for the guardian's demo and end-to-end tests.

``python -m guardian.demo.trainer key=value +key=value ...`` takes verl 0.9.1's command line and
writes verl's files: the ``file`` logger JSONL and console lines (``writers``), V1 rollout dumps,
FSDP-layout checkpoints with verl's resume and retention rules (``checkpoint``). The learning is real
(``policy``: a factorised softmax policy, verl's PPO/GRPO loss with analytic gradients; ``optim``:
AdamW, clipping, the constant-with-warmup schedule) on a verifiable toy task (``task``).

Modules: ``overrides`` (Hydra grammar, struct mode), ``config`` (verl's key names and defaults),
``settings`` (typed, validated view), ``metrics`` (verl's metric keys), ``rewards`` (pluggable
reward functions), ``scenarios`` (named runs: healthy, entropy_collapse, kl_blowup, nan, hang, crash,
length_explosion, and the seed tutorial's rescue patch).
"""
