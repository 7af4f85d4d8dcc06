"""Kernel side of jupyter_pause: runs inside the notebook's kernel process.

Nothing here imports tornado or jupyter_server: the kernel only needs IPython, traitlets,
cloudpickle and xxhash, and uses numpy/pandas/torch when the notebook already imported them.
"""
