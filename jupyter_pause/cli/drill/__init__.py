"""``jupyter pause drill``: the pause-and-resume check a platform team would do by hand.

``steps`` drives a server through a drill notebook (``notebook``) with ``client``, the last
three steps in ``probes``, against what ``plan`` names (notebooks, steps, findings); ``server``
starts a server of its own when none runs; ``upgrade`` tells a live restore from a restore from
files from a session that merely opened the notebook; ``render`` writes the report folder.
"""
