"""The fabric-keeper: the janitor that owns time (leases, gaps, deadlines, digests).

It never assigns and never triggers work. Its duties are plain functions over a
:class:`~fabric.core.Fabric` (:mod:`keeper.sweeps`, :mod:`keeper.gestures`,
:mod:`keeper.duties`, :mod:`keeper.gc`), each reading the board through
:mod:`keeper.snapshot`; :mod:`keeper.daemon` schedules them, :mod:`keeper.metrics`
serves what they saw and :mod:`keeper.notify` reaches humans. See ``keeper/README.md``.
"""
