"""The four layers as process roles. Each module is one role; none imports another."""
