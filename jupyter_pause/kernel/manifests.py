"""Reading a checkpoint's manifest: whether it is complete, and what it holds."""

from __future__ import annotations

from typing import Any

from .layout import DATA_FILE_RE, SHRINK

# What loading and collection read from every manifest, and its JSON type.
_MANIFEST_FIELDS: dict[str, type | tuple[type, ...]] = {
    "created": (int, float),
    "process_token": str,
    "buffers": dict,
    "frames": list,
    "skipped": dict,
}
_KIND_NAMES = {(int, float): "a number", str: "a string", dict: "an object", list: "a list"}


def manifest_problem(manifest: Any) -> str | None:
    """What a manifest lacks for loading and collection, or None when it is complete."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    for name, kind in _MANIFEST_FIELDS.items():
        value = manifest.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"{name!r} missing or not {_KIND_NAMES[kind]}"
    for digest, loc in manifest["buffers"].items():
        if not (
            isinstance(loc, dict)
            and isinstance(loc.get("file"), str)
            and DATA_FILE_RE.match(loc["file"])
            and all(
                isinstance(loc.get(k), int) and not isinstance(loc.get(k), bool) and loc[k] >= 0
                for k in ("offset", "nbytes")
            )
        ):
            return f"buffer {digest[:16]} has no valid location"
    for frame in manifest["frames"]:
        if not (
            isinstance(frame, dict)
            and isinstance(frame.get("frame"), str)
            and isinstance(frame.get("names"), list)
            and all(isinstance(n, str) for n in frame["names"])
        ):
            return "a frame lacks its names or data"
    if not isinstance(manifest.get("aliases", {}), dict):
        return "'aliases' is not an object"
    return None


def manifest_bytes(manifest: dict[str, Any]) -> int:
    """The data a checkpoint needs, shared buffers included."""
    return sum(location["nbytes"] for location in manifest["buffers"].values())


def manifest_variables(manifest: dict[str, Any]) -> list[str]:
    """The variable names a checkpoint holds, aliases included."""
    names = [name for frame in manifest["frames"] for name in frame["names"]]
    return sorted(names + list(manifest.get("aliases", {})))


def shrinks(before: list[str], after: list[str]) -> list[str]:
    """The variables of ``before`` that ``after`` lacks, when it lacks most of them (SHRINK),
    else an empty list: a checkpoint like that was written by a kernel without the
    session's state (a reopened notebook), or after the notebook deleted most of it."""
    missing = sorted(set(before) - set(after))
    return missing if len(missing) > SHRINK * len(before) else []


def manifest_shrink(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """``{"id": older, "missing": [...]}`` when the checkpoint shrank from ``older``, else None
    (a malformed mark counts as none: it only informs, it never decides what loads)."""
    mark = manifest.get("shrunk_from")
    if (
        isinstance(mark, dict)
        and isinstance(mark.get("id"), int)
        and isinstance(mark.get("missing"), list)
        and all(isinstance(name, str) for name in mark["missing"])
    ):
        return {"id": mark["id"], "missing": mark["missing"]}
    return None
