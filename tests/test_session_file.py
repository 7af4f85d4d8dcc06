"""Export and import of a session between two real servers (issue 39).

Two jupyter server processes with jupyter_pause, each with its own root, store and runtime
folder, run by two OS users when the tests run as root (as in CI), and real kernels: a session exported on one is imported on the other, stays
untrusted (nothing unpickled) until its user trusts it, then resumes from files with its
values equal. A session file that is altered, truncated, unsafe or of a newer format is
refused with its reason, and nothing is written.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster.notebooks import RemoteServer
from .server_process import ServerProcess, chown_tree, peer_user, start_server

pytestmark = pytest.mark.timeout(300)

EMPTY_NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}

WORK = """
import numpy as np, pandas as pd, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.ones(3, 4)).sum().backward()
optimizer.step()
frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
arrays = [np.arange(12.0).reshape(3, 4), np.eye(3)]
class Experiment:
    def __init__(self, name):
        self.name = name
    def describe(self):
        return f"experiment {self.name}"
run = Experiment("lr-0.1")
"""

FINGERPRINT = (
    "[model.weight.sum().item(), optimizer.state_dict()['state'][0]['momentum_buffer'].sum().item(),"
    " frame.to_dict('list'), arrays[0].sum().item(), arrays[1].trace().item(), run.describe()]"
)


def raw(server: RemoteServer, method: str, path: str, body: bytes | None = None):
    """(status, bytes, headers) of a request to the server's REST API."""
    request = urllib.request.Request(f"{server.url}/{path.lstrip('/')}", method=method, data=body)
    request.add_header("Authorization", f"token {server.token}")
    if body is not None:
        request.add_header("Content-Type", "application/x-tar")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def start(base: Path, name: str, user: pwd.struct_passwd | None = None) -> ServerProcess:
    root = base / f"{name}-root"
    root.mkdir()
    store = base / f"{name}-store"
    if user is not None:  # its own store, made by its user as a first start would
        store.mkdir(mode=0o700)
        chown_tree(store, user)
    return start_server(
        base / f"{name}-server",
        root,
        f"c.PauseApp.backend = 'local'\nc.PauseApp.store_root = {str(store)!r}\n",
        user,
    )


@pytest.fixture
def two_servers() -> Iterator[tuple[ServerProcess, ServerProcess, Path]]:
    """(here, there, their base folder): ``there`` runs as another OS user where this can be
    root. The base folder is not pytest's (other users cannot pass through that)."""
    base = Path(tempfile.mkdtemp(prefix="jp-two-servers-"))
    base.chmod(0o711)  # others pass through to the folders their user owns, list nothing
    servers: list[ServerProcess] = []
    try:
        servers.append(start(base, "here"))
        servers.append(start(base, "there", peer_user()))
        yield servers[0], servers[1], base
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


def exported(
    server: RemoteServer, root: Path, code: str = WORK, fingerprint: str = FINGERPRINT
) -> tuple[bytes, list]:
    """A notebook that ran ``code``, exported while it runs: (session file, ``fingerprint``)."""
    (root / "train.ipynb").write_text(json.dumps(EMPTY_NOTEBOOK))
    kernel = server.open_notebook("train.ipynb")
    server.run(kernel, code)
    values = json.loads(server.run(kernel, f"import json\nprint(json.dumps({fingerprint}))"))
    status, data, headers = raw(server, "GET", "/jupyter-pause/export/train.ipynb")
    assert status == 200, data
    assert headers["Content-Type"] == "application/x-tar"
    return data, values


def test_a_session_exported_here_resumes_there_once_trusted(two_servers) -> None:
    here, there, tmp_path = two_servers
    pytest.importorskip("torch")
    data, values = exported(here.server, tmp_path / "here-root")
    # The file says where it came from, and lists every member with its checksum
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        index = json.loads(tar.extractfile("session.json").read())
    assert names[:2] == ["session.json", "notebook.ipynb"], names
    assert set(index["members"]) == set(names[1:]), index["members"]
    assert index["environment"]["packages"]["torch"], index["environment"]
    assert index["format"] == 1 and index["made_by"] and index["made_on"]

    # When it is imported on the other server
    status, body, _ = raw(there.server, "POST", "/jupyter-pause/import/moved/train.ipynb", data)
    assert status == 201, body
    answer = json.loads(body)
    session = answer["session"]
    assert session["state"] == "paused", session
    assert session["message"].startswith(f"Paused (imported from {index['made_by']} on "), session
    assert "Trust it to resume: restoring runs code from it." in session["message"], session
    assert (tmp_path / "there-root" / "moved" / "train.ipynb").exists()
    # (the same name again is refused before the upload is taken)
    status, body, _ = raw(there.server, "POST", "/jupyter-pause/import/moved/train.ipynb", data)
    assert status == 409 and b"exists already" in body, body

    # Then opening it (JupyterLab starts a kernel) keeps it an import waiting for trust
    there.server.open_notebook("moved/train.ipynb")
    opened = there.server.session("moved/train.ipynb")
    assert opened["message"] == session["message"], opened
    # and it is not restored before its user trusts it: nothing is unpickled
    code, refused = there.server.request("POST", "/jupyter-pause/resume/moved/train.ipynb")
    assert code == 409, refused
    assert "Restoring it runs code from it: trust it first" in refused["message"], refused
    code, _ = there.server.request("POST", "/jupyter-pause/trust/moved/train.ipynb")
    assert code == 200
    code, _ = there.server.request("POST", "/jupyter-pause/resume/moved/train.ipynb")
    assert code == 202
    ready = there.server.wait_state("moved/train.ipynb", "ready", "partial", "failed")
    assert (ready["state"], ready["how"]) == ("ready", "files"), ready
    kernel = there.server.session("moved/train.ipynb")["kernel_id"]
    again = json.loads(there.server.run(kernel, f"import json\nprint(json.dumps({FINGERPRINT}))"))
    assert again == values
    # The import is its user's alone: every folder and file it wrote, owned by the user of
    # that server, readable by nobody else
    owner = os.stat(tmp_path / "there-server").st_uid
    if os.geteuid() == 0:
        assert owner != os.geteuid(), "as root, the other server runs as another user"
    written = [p for p in (tmp_path / "there-store").rglob("*") if "train" in str(p)]
    assert written, "the import wrote nothing to the store"
    for path in written:
        info = path.lstat()
        assert info.st_uid == owner, path
        assert stat.S_IMODE(info.st_mode) & 0o077 == 0, (path, oct(info.st_mode))


def refused_import(server: ServerProcess, tmp_path: Path, data: bytes) -> str:
    """Import ``data`` on ``server``: it must be refused (400) with nothing written."""
    store = tmp_path / "there-store"
    before = sorted(p.name for p in store.iterdir()) if store.exists() else []
    status, body, _ = raw(server.server, "POST", "/jupyter-pause/import/bad.ipynb", data)
    assert status == 400, body
    assert not (tmp_path / "there-root" / "bad.ipynb").exists()
    after = sorted(p.name for p in store.iterdir()) if store.exists() else []
    assert [n for n in after if n != ".transfer"] == [n for n in before if n != ".transfer"]
    transfer = store / ".transfer"
    assert not transfer.exists() or not any(transfer.iterdir()), list(transfer.iterdir())
    return json.loads(body)["message"]


def rebuilt(data: bytes, change) -> bytes:
    """The session file with ``change(name, bytes) -> (name, bytes, kind)`` applied per member."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data)) as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source.getmembers():
            content = source.extractfile(member).read()
            for name, body, kind in change(member.name, content):
                info = tarfile.TarInfo(name)
                info.type = kind
                if kind == tarfile.SYMTYPE:
                    info.linkname = "/etc/passwd"
                    target.addfile(info)
                else:
                    info.size = len(body)
                    target.addfile(info, io.BytesIO(body))
    return out.getvalue()


def test_a_damaged_or_unsafe_session_file_is_refused_and_nothing_is_written(two_servers) -> None:
    here, there, tmp_path = two_servers
    data, _values = exported(here.server, tmp_path / "here-root", "x = list(range(1000))", "x[-1]")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        data_member = next(n for n in tar.getnames() if n.startswith("checkpoint/packs/"))

    # A member altered after the export
    def tamper(name, body):
        if name == data_member:
            body = body[:-1] + bytes([body[-1] ^ 1])
        return [(name, body, tarfile.REGTYPE)]

    message = refused_import(there, tmp_path, rebuilt(data, tamper))
    assert f"member {data_member!r} does not match its checksum" in message, message
    # A truncated file
    message = refused_import(there, tmp_path, data[: len(data) // 2])
    assert "truncated" in message, message
    # A member that points outside, and one that is a link
    message = refused_import(
        there, tmp_path, rebuilt(data, lambda n, b: [(n, b, tarfile.REGTYPE)] + (
            [("../escape.txt", b"x", tarfile.REGTYPE)] if n == "notebook.ipynb" else []))
    )  # fmt: skip
    assert "'../escape.txt' points outside the session" in message, message
    assert not (tmp_path / "escape.txt").exists()
    message = refused_import(
        there, tmp_path, rebuilt(data, lambda n, b: [(n, b, tarfile.SYMTYPE if n == data_member
                                                       else tarfile.REGTYPE)])
    )  # fmt: skip
    assert f"member {data_member!r} is a link" in message, message

    # A file of a newer format
    def newer(name, body):
        if name == "session.json":
            index = json.loads(body)
            index["format"] = 99
            body = json.dumps(index).encode()
        return [(name, body, tarfile.REGTYPE)]

    message = refused_import(there, tmp_path, rebuilt(data, newer))
    assert "made by a newer jupyter_pause (session file format 99)" in message, message


def test_a_missing_module_restores_the_rest_and_names_what_it_skipped(two_servers) -> None:
    here, there, tmp_path = two_servers
    # A notebook using a module of its own folder, which the other server lacks
    (tmp_path / "here-root" / "helpers.py").write_text("class Box:\n    size = 3\n")
    data, _ = exported(
        here.server, tmp_path / "here-root", "import helpers\nbox = helpers.Box()\nx = 42", "x"
    )
    status, body, _ = raw(there.server, "POST", "/jupyter-pause/import/train.ipynb", data)
    assert status == 201, body
    assert there.server.request("POST", "/jupyter-pause/trust/train.ipynb")[0] == 200
    assert there.server.request("POST", "/jupyter-pause/resume/train.ipynb")[0] == 202
    ended = there.server.wait_state("train.ipynb", "ready", "partial", "failed")
    assert ended["state"] == "partial", ended
    assert "box" in ended["restore"]["failed"], ended["restore"]
    assert "helpers" in ended["restore"]["failed"]["box"], ended["restore"]
    kernel = there.server.session("train.ipynb")["kernel_id"]
    assert there.server.run(kernel, "print(x)").strip() == "42"


def test_the_command_line_exports_imports_and_trusts(two_servers) -> None:
    here, there, tmp_path = two_servers
    _data, values = exported(here.server, tmp_path / "here-root", "x = 42", "x")
    target = tmp_path / "carried.jpsession"

    def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyter_pause.cli", *args, "--url", server.server.url,
             "--token", server.server.token],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    done = cli(here, "export", "train.ipynb", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert target.exists() and f"to {target}" in done.stdout, done.stdout
    done = cli(there, "import", str(target), "--as", "from-cli.ipynb", "--trust")
    assert done.returncode == 0, done.stderr
    assert "Resume restores it from files" in done.stdout, done.stdout
    assert there.server.request("POST", "/jupyter-pause/resume/from-cli.ipynb")[0] == 202
    ready = there.server.wait_state("from-cli.ipynb", "ready", "partial", "failed")
    assert ready["state"] == "ready", ready
    kernel = there.server.session("from-cli.ipynb")["kernel_id"]
    assert there.server.run(kernel, "print(x)").strip() == str(values)

    # Before an upgrade: every paused session of a server, one file each
    code, _ = here.server.request("POST", "/jupyter-pause/pause/train.ipynb")
    assert code == 202
    here.server.wait_state("train.ipynb", "paused", "active")
    folder = tmp_path / "before-upgrade"
    done = cli(here, "export", "--all", str(folder))
    assert done.returncode == 0, done.stderr
    assert "1 of 1 paused sessions exported" in done.stdout, done.stdout
    assert (folder / "train.ipynb.jpsession").stat().st_size > 0


def test_a_download_broken_off_stops_the_export_and_frees_the_store(two_servers) -> None:
    import http.client
    import urllib.parse

    here, _there, tmp_path = two_servers
    _data, _ = exported(
        here.server, tmp_path / "here-root", "import numpy as np\nbig = np.ones(2**23)", "1"
    )
    # When a download of 64 MB is broken off after its first bytes
    url = urllib.parse.urlsplit(here.server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    connection.request(
        "GET",
        f"{url.path}/jupyter-pause/export/train.ipynb",
        headers={"Authorization": f"token {here.server.token}"},
    )
    answer = connection.getresponse()
    assert answer.status == 200
    assert int(answer.headers["Content-Length"]) > 64 * 2**20
    answer.read(4096)
    connection.close()
    # Then the server lets go of the store: a checkpoint and a whole export go through
    code, _ = here.server.request("POST", "/jupyter-pause/checkpoint/train.ipynb")
    assert code == 200
    status, data, headers = raw(here.server, "GET", "/jupyter-pause/export/train.ipynb")
    assert status == 200 and len(data) == int(headers["Content-Length"])
