"""Retention and collection: which checkpoints a policy deletes, and the data no one needs.

``Retention`` is a part of ``NotebookStore`` (its methods use the store's folder, lock and
manifests). Compacting a pack writes a new one with the checkpoint writer, imported only then:
a restore never loads the saving side.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .files import fsync_dir, write_file_atomically
from .layout import COMPACT_BELOW, BufferLocation, numbered


class Retention:
    """Deleting checkpoints (by hand or by policy) and collecting the files they leave."""

    # -- the hold ----------------------------------------------------------------------------
    @property
    def hold_path(self) -> Path:
        return self.path / "hold.json"

    def retention_hold(self) -> dict[str, Any] | None:
        """Why retention is held (a restore that did not bring everything back), or None."""
        try:
            hold = json.loads(self.hold_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:  # unreadable: keep holding, say why
            return {"checkpoints": {}, "unreadable": str(err)}
        if not isinstance(hold, dict) or not isinstance(hold.get("checkpoints"), dict):
            return {"checkpoints": {}, "unreadable": "not a hold record"}
        return hold

    def hold_retention(
        self, checkpoint_id: int, failed: dict[str, Any], newer: int | None = None
    ) -> dict[str, Any]:
        """Keep every checkpoint (no retention) until ``release_retention``: checkpoint
        ``checkpoint_id`` holds what a restore could not bring back (``failed``), or, with
        ``newer``, the variables that checkpoint ``newer`` lacks (it shrank: see SHRINK)."""
        self.prepare()
        hold = self.retention_hold() or {"checkpoints": {}}
        hold.pop("unreadable", None)
        entry: dict[str, Any] = {"failed": failed, "since": time.time()}
        if newer is not None:
            entry.update(kind="shrunk", newer=newer)
        hold["checkpoints"][str(checkpoint_id)] = entry
        write_file_atomically(self.hold_path, json.dumps(hold).encode())
        return hold

    def release_retention(self, checkpoint_id: int | None = None) -> None:
        """End the hold for one checkpoint (restored in full since), or for all (None)."""
        hold = self.retention_hold()
        if hold is not None and checkpoint_id is not None:
            if "unreadable" in hold:
                return  # what it held is unknown: only the user's decision ends it
            hold["checkpoints"].pop(str(checkpoint_id), None)
            if hold["checkpoints"]:
                write_file_atomically(self.hold_path, json.dumps(hold).encode())
                return
        self.hold_path.unlink(missing_ok=True)

    # -- retention and collection ---------------------------------------------------------------
    def delete(self, checkpoint_id: int) -> None:
        with self.locked():
            path = self.manifest_path(checkpoint_id)
            if not path.exists():
                self.read_manifest(checkpoint_id)  # raises CheckpointNotFound with the list
            path.unlink()
            fsync_dir(self.manifests_dir)
            self._collect_locked()

    def apply_retention(
        self, keep_last: int, max_age_seconds: float = 0, max_bytes: int = 0
    ) -> list[int]:
        """Delete old checkpoints by policy (never the newest one) and collect unused data."""
        with self.locked():
            removed = self._retention_locked(keep_last, max_age_seconds, max_bytes)
            self._collect_locked()
        return removed

    def _retention_locked(
        self, keep_last: int, max_age_seconds: float, max_bytes: int
    ) -> list[int]:
        # Retention decides over the intact checkpoints only: one this version cannot read is
        # never deleted by it. While a hold is in place (a restore did not bring everything
        # back) nothing is deleted: older checkpoints may hold data the newer ones lack.
        if self.retention_hold() is not None:
            return []
        manifests, _unreadable = self.scan()
        ids = sorted(manifests)
        if not ids:
            return []
        newest = ids[-1]
        doomed: set[int] = set()
        if keep_last > 0:
            doomed.update(ids[:-keep_last])
        if max_age_seconds > 0:
            cutoff = time.time() - max_age_seconds
            doomed.update(i for i, m in manifests.items() if m["created"] < cutoff)
        if max_bytes > 0:
            # Walk newest to oldest, keeping checkpoints while the data they need fits.
            seen: set[tuple[str, int]] = set()
            total = 0
            for i in sorted(manifests, reverse=True):
                if i in doomed:
                    continue
                spans = {
                    (loc["file"], loc["offset"]): loc["nbytes"]
                    for loc in manifests[i]["buffers"].values()
                    if (loc["file"], loc["offset"]) not in seen
                }
                extra = sum(spans.values()) + self.image_bytes(i)
                if total + extra > max_bytes and i != newest:
                    doomed.add(i)
                    continue
                seen.update(spans)
                total += extra
        doomed.discard(newest)
        for i in sorted(doomed):
            self.manifest_path(i).unlink()
        if doomed:
            fsync_dir(self.manifests_dir)
        return sorted(doomed)

    def _collect_locked(self) -> int:
        """Unlink data files no manifest references, compact mostly-dead packs; bytes freed.

        Nothing is collected while a manifest cannot be read (its files are unknown); data a
        manifest set aside as damaged still names (when it names any) stays with it.
        """
        manifests, unreadable = self.scan()
        if unreadable:
            return 0
        freed = self._collect_images(set(manifests))
        live: dict[str, int] = {}
        for manifest in manifests.values():
            for loc in manifest["buffers"].values():
                live[loc["file"]] = live.get(loc["file"], 0)  # referenced, even if empty
        untouched = self._files_of_damaged()  # neither deleted nor compacted
        spans = {
            (loc["file"], loc["offset"]): loc["nbytes"]
            for manifest in manifests.values()
            for loc in manifest["buffers"].values()
        }
        for (name, _offset), nbytes in spans.items():
            live[name] += nbytes
        for folder in ("blobs", "packs"):
            for dirpath, _dirs, files in os.walk(self.path / folder):
                for name in files:
                    full = Path(dirpath) / name
                    rel = full.relative_to(self.path).as_posix()
                    size = full.stat().st_size
                    if rel in untouched:
                        continue
                    if rel not in live:
                        freed += size
                        full.unlink()
                    elif folder == "packs" and size and live[rel] < COMPACT_BELOW * size:
                        freed += self._compact(rel, manifests) - live[rel]
        return freed

    def _files_of_damaged(self) -> set[str]:
        """Data files the manifests set aside as damaged still name, where they can be read."""
        files: set[str] = set()
        for checkpoint_id in numbered(self.path / "damaged"):
            path = self.path / "damaged" / f"{checkpoint_id:06d}.json"
            with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
                for loc in json.loads(path.read_bytes()).get("buffers").values():
                    with contextlib.suppress(AttributeError, TypeError):
                        files.add(str(loc.get("file")))
        return files

    def _compact(self, pack: str, manifests: dict[int, dict[str, Any]]) -> int:
        """Copy a pack's live buffers to a new pack, repoint the manifests, delete the old one.

        Crash-safe by order: until the last manifest is rewritten the old pack stays, so every
        manifest on disk points at a complete file. Returns the old pack's size.
        """
        spans = {
            (loc["offset"], loc["nbytes"])
            for manifest in manifests.values()
            for loc in manifest["buffers"].values()
            if loc["file"] == pack
        }
        from .writer import CheckpointWriter

        writer = CheckpointWriter(self, max(manifests), {}, prefix=f"compact-{os.getpid()}")
        source = self._map(pack)
        moved: dict[tuple[int, int], BufferLocation] = {}
        for offset, nbytes in sorted(spans):
            moved[(offset, nbytes)] = writer.append(memoryview(source)[offset : offset + nbytes])
        writer.finish_files()
        for checkpoint_id, manifest in manifests.items():
            changed = False
            for loc in manifest["buffers"].values():
                if loc["file"] == pack:
                    loc.update(moved[(loc["offset"], loc["nbytes"])].to_json())
                    changed = True
            if changed:
                write_file_atomically(
                    self.manifest_path(checkpoint_id),
                    json.dumps(manifest, separators=(",", ":")).encode(),
                )
        self._maps.pop(pack, None)
        size = (self.path / pack).stat().st_size
        (self.path / pack).unlink()
        return size

    def _collect_images(self, checkpoints: set[int]) -> int:
        """Delete the images whose checkpoint is gone; bytes freed."""
        freed = 0
        for checkpoint_id in self.image_ids():
            if checkpoint_id not in checkpoints:
                freed += self.image_bytes(checkpoint_id)
                remove_image(self.image_path(checkpoint_id))
        return freed

    def disk_usage(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.path):
            total += sum((Path(dirpath) / f).stat().st_size for f in files)
        return total


def remove_image(folder: Path) -> None:
    """Delete a process image that will never be restored, its network lock lifted first
    (criu's nftables table holds the kernel's connections until then)."""
    from ..backends.criu_tool import unlock_network  # only images need it; stdlib only

    unlock_network(folder)
    shutil.rmtree(folder, ignore_errors=True)
