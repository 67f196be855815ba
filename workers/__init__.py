"""Worker daemons: one per queue, each claiming tasks under epoch-fenced leases.

Read :mod:`workers.loop` top to bottom: run → loop → fetch (claim) → process, with the
lease heartbeat as a side task.
"""
