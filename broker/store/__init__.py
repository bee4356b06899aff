"""The context store: the current state of every entity, partitioned, durable (issue 17).

- ``broker.store.engine``: the embedded key-value storage under a store process (group
  commits);
- ``broker.store.semantics``: Orion's write semantics on one entity (what a write leaves,
  what it changed), pure functions;
- ``broker.store.operators``: the update operators (``$inc``, ``$push``...) on one value;
- ``broker.store.history_fold``: how a change becomes history (raw rows, level slots), pure
  functions; ``broker.store.history``: that history kept in the writes' commits;
  ``broker.store.history_query``: read back (docs/history.md);
- ``broker.store.changelog``: every change applied, kept in the writes' commits for the
  archiver (docs/archive.md).

docs/context-store.md says what is built and how the rest is designed.
"""
