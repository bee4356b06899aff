"""Tests of broker.coordination, against a real ZooKeeper server."""
