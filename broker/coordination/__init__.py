"""Coordination through ZooKeeper: connection, membership, cluster configuration, and an
embedded ZooKeeper server for one-host runs and tests.

One concept per module, each taking a kazoo client as its first argument (the recipes of
kazoo's ``recipe/`` package are the model):

- ``client``: :func:`~broker.coordination.client.connect` to one cluster's chroot
  (``/silbo/<cluster>``), and the connection-state watcher;
- ``membership``: ephemeral registration of each process under ``/members/<role>/``;
- ``configuration``: the compare-and-set ``/config`` znode (epoch, matchers, selector);
- ``embedded``: a standalone ZooKeeper server in a child JVM;
- ``errors``: the coordination errors, and the one place kazoo's exceptions are translated.

docs/coordination.md draws the znode layout and each recipe's state machine.
"""
