"""The NGSI v2 HTTP front of a connection point (docs/ngsi.md): Orion's API for publishing
updates and managing subscriptions whose notifications are HTTP requests.

The package imports nothing by itself: every role's process options name a few of its light
modules (``cors_options``, ``retry``, ``allow``), and only a connection point needs the front
(``front``, ``routes``) and aiohttp."""
