"""The drill's notebook: reproducible cells that save data, a checkpoint, a result and a model.

Every cell prints one JSON line the drill reads. The model is built from a fixed seed by
default (offline, the same bytes every time); ``--model`` loads a real one instead. The probe
cell runs the already-loaded model on a fixed input and prints a digest of its output: the
same digest before the pause and after the resume means bit-identical results.
"""

from __future__ import annotations

import json

DATA_DIR = "drill-data"
#: The files the drill notebook writes in DATA_DIR (its clean-up deletes these, no others).
DATA_FILES = ("input.npy", "result.json")

SETUP = f"""\
import hashlib, json, os, socket, time
import numpy as np
import torch
import jupyter_pause
torch.manual_seed(0)
os.makedirs({DATA_DIR!r}, exist_ok=True)
inputs = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
np.save({DATA_DIR!r} + "/input.npy", inputs)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
print(json.dumps({{"pid": os.getpid(), "host": socket.gethostname(), "device": str(device),
                  "token": jupyter_pause.process_token(), "torch": torch.__version__}}))
"""

#: A first cell that only shows the kernel answers (a new kernel is ready).
READY = "pass\n"

#: Builds ``model`` and ``probe`` (a fixed input of the model's kind) from ``MODEL_SPEC``.
MODEL = """\
def build_model(spec):
    if spec == "seed" or spec.startswith("seed:"):
        megabytes = float(spec.split(":", 1)[1]) if ":" in spec else 0.1
        width = max(16, int((megabytes * 1e6 / 4 / 2) ** 0.5))  # two square-ish layers
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
            torch.nn.ReLU(), torch.nn.Linear(width, 8))
        return net.to(device).eval(), torch.from_numpy(inputs[:16]).to(device)
    if spec.startswith("hf:"):
        from transformers import AutoModel  # the local cache only: the drill runs offline
        net = AutoModel.from_pretrained(spec[3:], local_files_only=True).to(device).eval()
        vocab = getattr(net.config, "vocab_size", 1000)
        return net, (torch.arange(16, device=device) % vocab).unsqueeze(0)
    net = torch.load(spec, weights_only=False, map_location=device)
    return net.eval(), torch.from_numpy(inputs[:16]).to(device)

model, probe = build_model(MODEL_SPEC)
print(json.dumps({"parameters": sum(p.numel() for p in model.parameters())}))
"""

PROBE = """\
with torch.no_grad():
    output = model(probe)
output = getattr(output, "last_hidden_state", output)
digest = hashlib.sha256(output.detach().cpu().numpy().tobytes()).hexdigest()
print(json.dumps({"digest": digest, "token": jupyter_pause.process_token(),
                  "cuda_bytes": torch.cuda.memory_allocated() if device.type == "cuda" else None}))
"""

RESULT = f"""\
with open({DATA_DIR!r} + "/result.json", "w") as handle:
    json.dump({{"digest": digest}}, handle)
saved = jupyter_pause.checkpoint()
print(json.dumps({{"checkpoint_id": saved.checkpoint_id, "bytes_written": saved.bytes_written}}))
"""

#: After a resume: the data files and the state the kernel has, against the saved result.
FILES = f"""\
import hashlib, json, os
def _sha(name):
    with open(os.path.join({DATA_DIR!r}, name), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
print(json.dumps({{"input": _sha("input.npy"), "result": _sha("result.json"),
                  "result_digest": json.load(open({DATA_DIR!r} + "/result.json"))["digest"],
                  "has_model": "model" in globals()}}))
"""

#: What the upgrade check asks a kernel: its liveness token, and the model if it has one.
LIVENESS = """\
import json, jupyter_pause
_saved = jupyter_pause.list_checkpoints()  # the manifests record their writer's token
_found = {"token": jupyter_pause.process_token(), "has_model": "model" in globals(),
          "written_by": _saved[-1].process_token if _saved else None}
if _found["has_model"]:
    import hashlib, torch
    with torch.no_grad():
        _out = model(probe)
    _out = getattr(_out, "last_hidden_state", _out)
    _found["digest"] = hashlib.sha256(_out.detach().cpu().numpy().tobytes()).hexdigest()
print(json.dumps(_found))
"""


def cells(model: str) -> list[str]:
    """The drill notebook's cells, in order (run from the top, they are the baseline)."""
    return [SETUP, f"MODEL_SPEC = {json.dumps(model)}\n" + MODEL, PROBE, RESULT]


def small_state(value: int) -> str:
    """A rush notebook's cell: a little state whose value tells it apart."""
    return (
        "import json, numpy as np\n"
        f"value = {value}\nweights = np.full(1000, {value}.0)\n"
        'print(json.dumps({"value": value}))\n'
    )


CHECK_SMALL_STATE = (
    'import json\nprint(json.dumps({"value": value, "sum": float(weights.sum())}))\n'
)


def delete_checkpoints(names: list[str]) -> str:
    """A cell deleting every checkpoint of the notebooks ``names`` (in the kernel's folder)."""
    return (
        "import json, os\n"
        "from jupyter_pause.kernel import store as _store\n"
        "_deleted = {}\n"
        f"for _name in {names!r}:\n"
        "    _notebook = _store.NotebookStore(_store.default_store_root(),\n"
        "                                     os.path.join(os.getcwd(), _name))\n"
        "    if _notebook.exists():\n"
        "        _intact, _bad = _notebook.scan()\n"
        "        for _id in sorted(_intact):\n"
        "            _notebook.delete(_id)\n"
        "        _deleted[_name] = sorted(_intact)\n"
        "print(json.dumps(_deleted))\n"
    )
