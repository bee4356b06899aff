"""Partitioning subscriptions among matchers: the selector and per-owner state parts."""
