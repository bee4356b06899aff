"""The context store: the current state of every entity, partitioned, durable (issue 17).

- ``broker.store.engine``: the embedded key-value storage under a store process (group
  commits);
- ``broker.store.semantics``: Orion's write semantics on one entity (what a write leaves,
  what it changed), pure functions.
"""
