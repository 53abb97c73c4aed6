"""What the guardian tells people: events derived from the store, delivered to notifiers and Grafana."""
