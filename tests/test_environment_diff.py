"""What a restore elsewhere says differs from where the checkpoint was made (issue 39):
read from this installation (numpy and pytest are installed here, the made-up package is not),
nothing imported to find out."""

from __future__ import annotations

import platform

import numpy

from jupyter_pause.kernel.environment_diff import differences, installed_version


def test_the_same_environment_differs_in_nothing() -> None:
    here = {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "packages": {"numpy": numpy.__version__},
    }
    assert differences(here) == []


def test_missing_packages_other_versions_and_another_python_are_named() -> None:
    found = differences(
        {
            "python": "2.7.18",
            "platform": "Darwin arm64",
            "packages": {"numpy": "0.9.0", "no_such_package_here": "1.2.3"},
        }
    )
    assert f"Python 2.7.18 made it, this is Python {platform.python_version()}" in found
    assert f"made on Darwin arm64, this is {platform.system()} {platform.machine()}" in found
    assert f"numpy 0.9.0 made it, {numpy.__version__} is installed here" in found
    assert (
        "no_such_package_here 1.2.3 is not installed here: objects of it cannot be restored"
        in found
    )


def test_a_distribution_named_otherwise_than_its_module_is_found() -> None:
    # (pytest's module is _pytest too; "yaml" is PyYAML's module: a name that differs)
    assert installed_version("yaml") is not None
    assert installed_version("no_such_package_here") is None
