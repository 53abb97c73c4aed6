"""The search agent's turn loop (``protocol``: text rules; ``episode``: the loop) and its two drivers: verl's agent
loop for training and an OpenAI-compatible client for evaluation."""
