"""The data model: context updates, subscriptions, what an update changed (``change``) and
the rules for names. Pure: no I/O."""
