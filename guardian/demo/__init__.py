"""A verl-compatible GRPO trainer on CPU (numpy only), for the guardian's demo and end-to-end tests.

``python -m guardian.demo.trainer key=value ...`` takes verl 0.9.1's command line and writes verl's files (metrics
JSONL, console lines, V1 rollout dumps, FSDP-layout checkpoints). The learning is real, on a toy task; named
scenarios (``scenarios``) make each failure happen. It is not verl: no GPU, no Ray, no model.
Why: docs/decisions/0011-a-numpy-trainer-that-speaks-verl.md.
"""
