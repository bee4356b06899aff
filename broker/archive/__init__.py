"""The archive: every change the context stores apply, as Parquet files (docs/archive.md).

- ``broker.archive.location``: where the archive is (a directory, or a URI such as
  ``s3://bucket/prefix``) and how a file appears there whole or not at all;
- ``broker.archive.files``: the files: layout, schema, atomic writes, what they hold;
- ``broker.archive.state``: the archiver's cursors and its batch in progress, in ZooKeeper.

The stores keep the changes (broker.store.changelog); the archiver process
(broker.roles.archiver) moves them here; ``silbo archive status`` (broker.commands.archive)
reports; ``silbo replay --archive`` (spark_matcher.archive_replay) and ``silbo backfill``
(spark_matcher.backfill) read them on Spark (spark_matcher.archive).
"""
