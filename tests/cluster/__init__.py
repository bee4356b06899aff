"""Tests of the local cluster (real processes, real ZooKeeper)."""
