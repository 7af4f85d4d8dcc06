"""The GPU-hours report: where the hours of recorded timelines went, and what pausing saved.

``spans`` turns one notebook's timeline into held, idle, released spans and absences (pure
arithmetic); ``study`` replays the absences under other idle thresholds; ``sources`` reads the
notebooks from a store or asks a server; ``report`` assembles the numbers and ``render`` writes
them as Markdown, JSON and charts. Imported only by ``jupyter pause report`` and the server's
``GET /jupyter-pause/usage``: ``jupyter pause status`` never pays for it.
"""
