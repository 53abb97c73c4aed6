"""Read models over the store for people reviewing a run: lineage, incident cost, incident rows, the launch
checklist. What ``guardian incidents``, ``guardian checklist`` and the report show; they decide and write nothing."""
