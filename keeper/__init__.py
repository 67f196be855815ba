"""The fabric-keeper: the janitor that owns time (leases, gaps, deadlines, digests).

It never assigns and never triggers work. :mod:`keeper.sweeps` holds its duties as
plain functions over a :class:`~fabric.core.Fabric`.
"""
