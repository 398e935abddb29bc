"""Kernels that execute chapters side by side without racing for network ports.

jupyter_client's default transport is TCP: the kernel manager finds five free ports, lets them
go, and the kernel binds them a moment later. Any other process that starts a kernel (or opens
a connection) in between can take one of them: the kernel then dies at its start ("ZMQError:
Address already in use", then "Kernel died before replying to kernel_info"), which happened to
the book's build while pytest's chapter tests started kernels beside it. Over IPC a kernel's
sockets are files in a folder of this process's own, named per kernel: no other kernel can take
them. jupyter_client has the transport but no setting that makes it the default for nbclient
and papermill, hence this small class (``kernel_manager_class=IPCKernelManager``).

>>> IPCKernelManager().transport
'ipc'
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from multiprocessing import util

from jupyter_client.manager import AsyncKernelManager
from traitlets import default

_FOLDER: str | None = None


def _private_folder() -> str:
    """This process's folder for kernel sockets."""
    global _FOLDER
    if _FOLDER is None or not os.path.isdir(_FOLDER):
        # a socket's path has at most 107 bytes: a short folder, not one under a long TMPDIR
        base = tempfile.gettempdir()
        _FOLDER = tempfile.mkdtemp(prefix="ccu-kernels-", dir=base if len(base) < 60 else "/tmp")
        # removed when this process ends, also as a multiprocessing worker (os._exit skips
        # atexit there, not multiprocessing's finalizers)
        util.Finalize(None, shutil.rmtree, args=(_FOLDER,), kwargs={"ignore_errors": True},
                      exitpriority=0)  # fmt: skip
    return _FOLDER


class IPCKernelManager(AsyncKernelManager):
    """nbclient's kernel manager (``AsyncKernelManager``) on the IPC transport, each kernel's
    sockets in this process's private folder (``<folder>/<uuid>-<n>``)."""

    @default("transport")
    def _ipc(self) -> str:
        return "ipc"

    @default("ip")
    def _private_sockets(self) -> str:
        return os.path.join(_private_folder(), uuid.uuid4().hex[:12])
