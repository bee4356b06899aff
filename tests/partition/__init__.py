"""Tests of broker.partition."""
