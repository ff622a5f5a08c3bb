#!/usr/bin/python
"""Ansible module: sync a commitment's model files into verifierd's weights cache.

The cache layout is verifierd's (verifierd/weights_cache.py): one directory per
set of committed files, named by the commitment's ``weights_id`` (SHA-256 of the
canonical JSON {path: sha256} map), and ``.stamps/<weights_id>.json`` holding,
per file, the digest with the (size, mtime_ns, ctime_ns, inode) it was computed
for. A file whose stamp still matches its stat is trusted without rehashing, so
a second run reads no weights; any other file is hashed, and a missing or
mismatching one is copied again from ``source``, hashing while copying, into a
hidden temporary name that is renamed into place only when the digest matches
the commitment. A first install is staged in a hidden directory and renamed
into place whole, so a source file with the wrong digest fails the task and
leaves nothing behind. Files in the cache directory that the commitment does not name
fail the task too (verifierd would refuse the directory).

Uses only the standard library, so it runs with the host's own Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: veritap_weights
short_description: Copy and digest-check a commitment's model files into verifierd's weights cache
options:
  commitment:
    description: The commitment JSON file (verifierd commit) on the target.
    type: path
    required: true
  source:
    description: Directory on the target holding the model files (e.g. a shared filesystem).
    type: path
    required: true
  weights_dir:
    description: verifierd's weights_dir.
    type: path
    required: true
  owner:
    description: Numeric uid that owns the cache (verifierd rewrites the stamps).
    type: int
  group:
    description: Numeric gid of the cache.
    type: int
"""

_CHUNK = 1 << 20
#: What verifierd ignores in a model directory (commitments.model_files).
_IGNORED = re.compile(r"(?i)^(readme.*|license.*|notice.*|.*\.md|\.gitattributes)$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class WeightsError(Exception):
    """The cache cannot be brought to the committed state."""


def canonical(obj: object) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def load_commitment(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        raise WeightsError(f"{path}: no files in the commitment")
    for rel, entry in files.items():
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "\\" in rel:
            raise WeightsError(f"{path}: committed path {rel!r} leaves the model directory")
        if not _HEX64.match(str(entry.get("sha256", ""))):
            raise WeightsError(f"{path}: bad sha256 for {rel!r}")
    return data


def weights_id(files: dict[str, Any]) -> str:
    return hashlib.sha256(canonical({p: e["sha256"] for p, e in files.items()})).hexdigest()


def stamp_of(st: os.stat_result, sha256: str) -> dict[str, Any]:
    return {
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "sha256": sha256,
        "size": st.st_size,
    }


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def present_files(directory: str) -> set[str]:
    """The files verifierd would count in a model directory (hidden and docs skipped)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or _IGNORED.match(name):
                continue
            found.add(os.path.relpath(os.path.join(dirpath, name), directory).replace(os.sep, "/"))
    return found


class Sync:
    def __init__(self, params: dict[str, Any], check: bool) -> None:
        self.commitment = load_commitment(params["commitment"])
        self.files: dict[str, Any] = self.commitment["files"]
        self.source: str = params["source"]
        self.root: str = params["weights_dir"]
        self.owner: int | None = params["owner"]
        self.group: int | None = params["group"]
        self.check = check
        self.id = weights_id(self.files)
        self.target = os.path.join(self.root, self.id)
        self.stamp_path = os.path.join(self.root, ".stamps", f"{self.id}.json")
        self.copied: list[str] = []
        self.hashed = 0

    def _own(self, path: str, mode: int) -> None:
        os.chmod(path, mode)
        if self.owner is not None or self.group is not None:
            os.chown(
                path,
                -1 if self.owner is None else self.owner,
                -1 if self.group is None else self.group,
            )

    def _mkdir(self, path: str) -> None:
        if not os.path.isdir(path):
            os.makedirs(path)
            self._own(path, 0o750)

    def _read_stamps(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.stamp_path, encoding="utf-8") as handle:
                data = json.load(handle)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _copy(self, rel: str, sha256: str, into: str) -> None:
        src = os.path.join(self.source, rel)
        dst = os.path.join(into, rel)
        if not os.path.isfile(src):
            raise WeightsError(f"{src}: committed file missing from the source")
        self._mkdir(os.path.dirname(dst))
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".veritap-")
        try:
            digest = hashlib.sha256()
            with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
                while chunk := fin.read(_CHUNK):
                    digest.update(chunk)
                    fout.write(chunk)
                fout.flush()
                os.fsync(fout.fileno())
            if digest.hexdigest() != sha256:
                raise WeightsError(
                    f"{src}: sha256 {digest.hexdigest()}, the commitment says {sha256}"
                )
            self._own(tmp, 0o640)
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.copied.append(rel)

    def run(self) -> bool:
        """Bring the cache to the commitment; True when anything was (or would be) written."""
        if os.path.isdir(self.target):
            extra = sorted(present_files(self.target) - set(self.files))
            if extra:
                raise WeightsError(f"{self.target}: files not in the commitment: {extra[:5]}")
        old_stamps = self._read_stamps()
        stamps: dict[str, dict[str, Any]] = {}
        stale: list[str] = []
        for rel, entry in sorted(self.files.items()):
            path = os.path.join(self.target, rel)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                stale.append(rel)
                continue
            stamp = old_stamps.get(rel)
            if stamp == stamp_of(st, entry["sha256"]):
                stamps[rel] = stamp
                continue
            self.hashed += 1
            if sha256_file(path) == entry["sha256"]:
                stamps[rel] = stamp_of(os.stat(path), entry["sha256"])
            else:
                stale.append(rel)
        if not stale and stamps == old_stamps:
            return False
        if self.check:
            self.copied = stale
            return True
        self._mkdir(self.root)
        self._mkdir(os.path.dirname(self.stamp_path))
        if os.path.isdir(self.target):
            # Repair in place: each file is replaced only by a verified copy.
            for rel in stale:
                self._copy(rel, self.files[rel]["sha256"], self.target)
        else:
            # First install: stage everything, then one rename, as verifierd does.
            staging = tempfile.mkdtemp(dir=self.root, prefix=".install-")
            try:
                self._own(staging, 0o750)
                for rel in stale:
                    self._copy(rel, self.files[rel]["sha256"], staging)
                os.rename(staging, self.target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        for rel in stale:
            path = os.path.join(self.target, rel)
            stamps[rel] = stamp_of(os.stat(path), self.files[rel]["sha256"])
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.stamp_path), prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(dict(sorted(stamps.items())), handle, sort_keys=True)
        self._own(tmp, 0o640)
        os.replace(tmp, self.stamp_path)
        return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "commitment": {"type": "path", "required": True},
            "source": {"type": "path", "required": True},
            "weights_dir": {"type": "path", "required": True},
            "owner": {"type": "int"},
            "group": {"type": "int"},
        },
        supports_check_mode=True,
    )
    try:
        sync = Sync(module.params, module.check_mode)
        changed = sync.run()
    except (WeightsError, OSError, ValueError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=changed,
        weights_id=sync.id,
        path=sync.target,
        commitment_id=sync.commitment.get("commitment_id", ""),
        served_model_names=sync.commitment.get("served_model_names", []),
        tensor_parallel_size=sync.commitment.get("tensor_parallel_size"),
        files_copied=sync.copied,
        files_hashed=sync.hashed,
    )


if __name__ == "__main__":
    main()
