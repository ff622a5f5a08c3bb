"""systemd integration: sd_notify, watchdog and journald glue.

The units, example configs, tmpfiles.d entries and the deployment notes live
beside this package in appliance/ as plain files.
"""
