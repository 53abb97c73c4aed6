"""Readers of what a verl run writes: metrics JSONL, console lines, rollout dumps."""
