"""A whole cluster on this machine: what ``silbo up`` and ``silbo down`` manage."""

from broker.cluster.local import ClusterSpec, LocalCluster, stop_cluster

__all__ = ["ClusterSpec", "LocalCluster", "stop_cluster"]
