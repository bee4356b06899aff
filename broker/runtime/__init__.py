"""What every broker process shares: options, metrics, peers, outbound links, the run loop.

The four roles (broker.roles) build on this package and never import each other.
"""
