"""Matching: the indexed engine and the reference matcher it is tested against."""
