"""From the timeline to incidents: one tick judges the new steps (``tick.IncidentTick``), the tracker turns
findings into transitions, and the store keeps findings and incidents; ``replay`` does the same over a
finished log."""
