"""Tests of silbo commands run as processes."""
