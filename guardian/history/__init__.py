"""The run's timeline: every signal step by step, across resumes (a resume opens a new branch)."""
