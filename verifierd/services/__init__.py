"""Async services the daemon runs beside the scheduler, one module each.

Each module defines ``create(context: verifierd.daemon.DaemonContext) -> Service | None``
(None when the configuration turns the service off); the service has ``name``,
``async start()`` and ``async stop()``. See verifierd.daemon.
"""
