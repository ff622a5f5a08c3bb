"""veritap-tui: the Textual operator console (entry point tui.app:main).

It talks to the daemons only through tui.client; screens live in tui.screens, shared
widgets in tui.widgets, styles in console.tcss.
"""
