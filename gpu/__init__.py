"""Harness for proving the guardian on real verl 0.9.1 on one GPU (see gpu/README.md)."""
