"""The console's screens, one module each; :mod:`console_screen` is their common frame."""
