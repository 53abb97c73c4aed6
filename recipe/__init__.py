"""The search-agent training recipe the guardian protects: Qwen2.5-7B-Instruct as a Search-R1-style agent with
verl 0.9.1 GRPO (HotpotQA + 2WikiMultihopQA, BM25 retrieval, EM reward, multi-turn ``<search>`` calls).

It imports nothing from ``guardian``; the two meet through files, metric keys and the run command.
"""
