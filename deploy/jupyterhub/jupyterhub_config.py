# JupyterHub on one machine with jupyter_pause: `jupyterhub -f deploy/jupyterhub/jupyterhub_config.py`
# (`make hub` starts it with the demo). A pause checkpoints every notebook of a user's server and
# asks the Hub to stop that server, so its process and GPU go back; the Hub's idle culler stops
# idle servers only after jupyter_pause has checkpointed them. Tested by tests/test_jupyterhub.py
# with JupyterHub 6.1.1, configurable-http-proxy 5.3.0 and jupyterhub-idle-culler 2.0.0.
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 - JupyterHub's config loader provides it

bin_dir = Path(sys.executable).parent
# The Hub's idle culler's --timeout (s); jupyter_pause checkpoints idle kernels at 80 % of it.
cull_seconds = int(os.environ.get("JUPYTER_PAUSE_HUB_CULL_SECONDS", "3600"))

# The one line jupyter_pause needs (JupyterHub >= 4): each server's own token may stop that
# server, and nothing else. Without delete:servers!server a pause stops the kernels only, and
# the GPU stays held until the culler comes (the chip and `jupyter pause status` say so).
c.Spawner.server_token_scopes = [
    "access:servers!server",
    "users:activity!user",
    "delete:servers!server",
    "read:servers!server",  # its own spawn's start: the wait for it goes on the timeline
]

# The single-user server: jupyterhub-singleuser from the environment jupyter_pause is in.
c.Spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
c.Spawner.args = [
    f"--PauseApp.hub_culler_timeout_seconds={cull_seconds}",
    # LocalProcessSpawner stops a server with SIGINT, then SIGTERM after interrupt_timeout:
    # the last checkpoint of every kernel must be written before that.
    "--PauseApp.platform_stop_seconds=8",
]
c.LocalProcessSpawner.interrupt_timeout = 10
c.Spawner.default_url = "/lab"

# The Hub's idle culler, as a Hub service with the least scopes it needs.
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={cull_seconds}",
            f"--cull-every={max(5, cull_seconds // 6)}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]

if os.environ.get("JUPYTER_PAUSE_HUB_DEMO"):
    # The demo (`make hub`): any name logs in with the password below, and each user's server
    # runs as this machine's user with its home in ./hub/home/<name>. Use a real authenticator
    # and LocalProcessSpawner (or SystemdSpawner) with system users in production.
    demo = Path(os.environ["JUPYTER_PAUSE_HUB_DEMO"]).resolve()
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = os.environ.get("JUPYTER_PAUSE_HUB_PASSWORD", "pause")
    c.Authenticator.allow_all = True
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = str(demo / "home" / "{username}")
    c.JupyterHub.db_url = f"sqlite:///{demo / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(demo / "jupyterhub_cookie_secret")
    c.ConfigurableHTTPProxy.pid_file = str(demo / "jupyterhub-proxy.pid")
    # configurable-http-proxy from the project's npm packages (jlpm install)
    chp = Path(__file__).resolve().parents[2] / "node_modules" / ".bin" / "configurable-http-proxy"
    if chp.exists():
        c.ConfigurableHTTPProxy.command = [str(chp)]
    if os.getuid() == 0:  # the demo's servers run as this user; jupyter-server refuses root
        c.Spawner.args.append("--allow-root")
    demo_notebook = os.environ.get("JUPYTER_PAUSE_HUB_DEMO_NOTEBOOK")
    if demo_notebook:  # each new user finds the demo notebook in their home

        def copy_demo(spawner):
            home = Path(spawner.home_dir)
            home.mkdir(parents=True, exist_ok=True)
            if not (home / "demo.ipynb").exists():
                (home / "demo.ipynb").write_bytes(Path(demo_notebook).read_bytes())

        c.Spawner.pre_spawn_hook = copy_demo
