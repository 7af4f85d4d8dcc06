# Installed by jupyter_pause as <sys.prefix>/etc/ipython/startup/50-jupyter-pause.py, which IPython
# runs in every kernel of this environment before the first cell: kernels started by a Jupyter
# server with the jupyter_pause extension get %checkpoint and %pause from the start.
try:
    from jupyter_pause.kernel.autoload import load as _jupyter_pause_autoload
except ImportError:  # an older or removed jupyter_pause left this file behind
    pass
else:
    _jupyter_pause_autoload(get_ipython())  # noqa: F821
    del _jupyter_pause_autoload
