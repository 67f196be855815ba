"""The embedded Kanboard-compatible board: SQLite behind Kanboard's JSON-RPC API.

It exists so the fabric runs on a fresh machine with no PHP, and so integration tests
talk real HTTP to something with Kanboard's semantics. The contract suite in
``tests/contract`` holds it to the same assertions as a real Kanboard.

:mod:`.rpc` is the dispatcher (:class:`~.rpc.BoardApi`); :mod:`.procedures` holds the
procedures, one module per group of Kanboard's API reference; :mod:`.php` imitates PHP's
value semantics, :mod:`.flavour` a database backend's, :mod:`.search` the search query
language; :mod:`.store` is the SQLite database, :mod:`.server` the HTTP face and
:mod:`.local` an in-process storage port. It depends only on the storage port's
vocabulary (``fabric.kanboard.port``, ``fabric.kanboard.dates``, ``fabric.errors``).
"""
