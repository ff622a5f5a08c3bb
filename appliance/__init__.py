"""systemd integration: sd_notify, watchdog and journald glue, plus the units and configs beside it."""
