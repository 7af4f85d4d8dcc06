"""Process-wide settings of the libraries a notebook imports, and warnings already shown,
each in a real kernel (issue 38: what 20 more public notebooks showed a restore missed).

scikit-learn's ``set_config`` (metadata routing: the estimators' requests fail without it),
torch's default device and print options, ``jax.config`` flags, ``tqdm.pandas()``; a warning
shown once before the pause is not shown again after it, and a checkpoint by itself never
makes one show twice; JAX values that hold a traced computation are named in words.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .kernels import KernelFactory, checkpoint, restore


def test_scikit_learns_config_comes_back_and_routing_requests_work(
    start_kernel: KernelFactory,
) -> None:
    pytest.importorskip("sklearn")
    # Given metadata routing on, pandas output, and an estimator with a routing request
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import sklearn
from sklearn.linear_model import LogisticRegression
sklearn.set_config(enable_metadata_routing=True, transform_output="pandas",
                   assume_finite=True, working_memory=512, display="text")
model = LogisticRegression().set_fit_request(sample_weight=True)
"""
    )
    before = first.value("{k: str(v) for k, v in sklearn.get_config().items()}")
    checkpoint(first)

    # When a new kernel restores
    second = start_kernel()
    result = restore(second)

    # Then the whole config is as it was, and routing works on the restored estimator
    assert result["session"]["failed"] == {}, result["session"]
    assert second.value("{k: str(v) for k, v in sklearn.get_config().items()}") == before
    assert second.value("str(model.get_metadata_routing().fit.requests['sample_weight'])") == "True"
    second.ok("LogisticRegression().set_score_request(sample_weight=True)")


def test_torch_default_device_and_print_options_come_back(start_kernel: KernelFactory) -> None:
    pytest.importorskip("torch")
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport torch\ntorch.set_default_device('meta')\n"
        "torch.set_printoptions(precision=2, sci_mode=False)"
    )
    checkpoint(first)
    second = start_kernel()
    assert restore(second)["session"]["failed"] == {}
    assert second.value(
        "[str(torch.empty(1).device), torch._tensor_str.PRINT_OPTS.precision, "
        "torch._tensor_str.PRINT_OPTS.sci_mode]"
    ) == ["meta", 2, False]


def test_jax_config_flags_come_back(start_kernel: KernelFactory) -> None:
    pytest.importorskip("jax")
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport jax\njax.config.update('jax_enable_x64', True)\n"
        "jax.config.update('jax_default_matmul_precision', 'highest')\n"
        "import jax.numpy as jnp\nx = jnp.arange(3.0)"
    )
    checkpoint(first)
    second = start_kernel()
    assert restore(second)["session"]["failed"] == {}
    assert second.value(
        "[str(jnp.array(1.0).dtype), jax.config.jax_default_matmul_precision, str(x.dtype)]"
    ) == ["float64", "highest", "float64"]


def test_tqdm_pandas_progress_apply_comes_back(start_kernel: KernelFactory) -> None:
    pytest.importorskip("tqdm")
    pytest.importorskip("pandas")
    first = start_kernel()
    first.ok(
        "%load_ext jupyter_pause\nimport pandas as pd\nfrom tqdm import tqdm\ntqdm.pandas()\n"
        "df = pd.DataFrame({'a': [1, 2, 3]})"
    )
    checkpoint(first)
    second = start_kernel()
    assert restore(second)["session"]["failed"] == {}
    assert second.value("int(df.progress_apply(lambda c: c.sum())['a'])") == 6


#: A library whose function warns (a module of its own: IPython forgets the notebook's own
#: warnings before every cell, so those show every time in any kernel).
TRAINER = """
import warnings

def train():
    warnings.warn("learning rate is high", UserWarning)
    return 1

def other():
    warnings.warn("new one", UserWarning)
"""


def test_a_warning_shown_before_the_pause_is_not_shown_again(
    start_kernel: KernelFactory, tmp_path: Path
) -> None:
    # Given a library function that warned once (the default: once per place)
    (tmp_path / "trainer.py").write_text(TRAINER)
    first = start_kernel(cwd=tmp_path)
    first.ok("%load_ext jupyter_pause\nimport trainer")
    assert "learning rate is high" in first.run("trainer.train()").stderr
    assert "learning rate is high" not in first.run("trainer.train()").stderr
    # (a checkpoint by itself, which silences libraries while it reads them, changes nothing)
    checkpoint(first)
    assert "learning rate is high" not in first.run("trainer.train()").stderr

    # When a new kernel restores
    second = start_kernel(cwd=tmp_path)
    result = restore(second)
    assert result["session"]["failed"] == {}, result["session"]
    assert any("warnings already shown" in s for s in result["session"]["done"]["settings"]), result

    # Then the same call does not warn again, as in the uninterrupted kernel
    assert "learning rate is high" not in second.run("trainer.train()").stderr
    # while a warning never shown before still shows
    assert "new one" in second.run("trainer.other()").stderr


def test_jax_values_that_hold_a_trace_are_named_in_words(start_kernel: KernelFactory) -> None:
    pytest.importorskip("jax")
    first = start_kernel()
    first.ok(
        """
%load_ext jupyter_pause
import jax, jax.numpy as jnp
f = lambda x: jnp.sin(x) * x
y, pullback = jax.vjp(f, 1.0)
key = jax.random.key(0)
"""
    )
    result = checkpoint(first)
    skipped = result["skipped"]
    assert skipped["pullback"] == (
        "a JAX pullback from `jax.vjp`: call `jax.vjp` again after the restore"
    ), skipped
    assert "key" not in skipped and "y" not in skipped, skipped
