"""Server side of jupyter_pause: runs inside jupyter-server.

``app.py`` is the extension (admin settings, start and stop), ``routes.py`` the REST handlers
over ``/jupyter-pause/``. Everything else is plain asyncio, no HTTP: ``orchestrator.py``
coordinates the parts that each own one concern of a notebook session (see its docstring), and
``environment.py`` pauses a whole workspace pod. ``states.py`` names the states and errors that
every part shares and imports nothing of theirs.

Nothing is imported here: loading the extension point must stay cheap, and a kernel never
imports this package.
"""
