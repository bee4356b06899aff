"""The data model: context updates, subscriptions and the rules for names. Pure: no I/O."""
