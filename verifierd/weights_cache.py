"""Content-addressed model directories, checked against their commitment before use.

The cache root holds one directory per set of committed files, named by the
commitment's ``weights_id`` (SHA-256 over the canonical {path: sha256} map), so
commitments that differ only in settings share weights. Before an engine loads
a directory, :meth:`WeightsCache.verify` checks that it holds exactly the
committed files with the committed digests.

Hashing 100 GB on every restart is not acceptable, so each verified file's
digest is remembered in a stamp together with its (size, mtime_ns, ctime_ns,
inode); a file whose stat still matches its stamp is not hashed again. ctime
cannot be set from user space, so rewriting a file and restoring its mtime
still forces a rehash. ``reverify=True`` ignores the stamps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from verifierd.commitments import Commitment, model_files, sha256_file
from verifierd.errors import VerifierdError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


class WeightsError(VerifierdError):
    """The committed files cannot be used; ``reason`` is the verdict reason it leads to."""

    reason = "weights_mismatch"


class WeightsMissingError(WeightsError):
    """The cache has no directory (or not every file) for the commitment."""

    reason = "weights_missing"


class WeightsMismatchError(WeightsError):
    """A file's digest differs from the commitment, or the directory holds extra files."""

    reason = "weights_mismatch"


@dataclass(frozen=True)
class _Stamp:
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    sha256: str

    @classmethod
    def of(cls, st: os.stat_result, sha256: str) -> _Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha256)

    def matches(self, st: os.stat_result) -> bool:
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode) == (
            st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            st.st_ino,
        )


@dataclass(frozen=True)
class VerifiedWeights:
    path: Path
    #: Files whose content was hashed in this check (0 when every stamp was fresh).
    files_hashed: int
    bytes_hashed: int


class WeightsCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path_for(self, commitment: Commitment) -> Path:
        return self.root / commitment.weights_id

    def _stamp_path(self, commitment: Commitment) -> Path:
        return self.root / ".stamps" / f"{commitment.weights_id}.json"

    def install(self, commitment: Commitment, source: Path) -> Path:
        """Copy the committed files from ``source`` into the cache, hashing as they are
        copied; raises WeightsMismatchError (and leaves nothing behind) when a file differs."""
        target = self.path_for(commitment)
        if target.exists():
            self.verify(commitment)
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".install-", dir=self.root))
        try:
            for f in commitment.files:
                src, dst = source / f.path, staging / f.path
                if not src.is_file():
                    raise WeightsMissingError(f"{src}: committed file not found")
                dst.parent.mkdir(parents=True, exist_ok=True)
                digest = _copy_hashing(src, dst)
                if digest != f.sha256:
                    raise WeightsMismatchError(f"{src}: sha256 {digest}, committed {f.sha256}")
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.verify(commitment, reverify=True)
        log.info(
            "installed weights",
            extra={"weights_id": commitment.weights_id, "path": str(target)},
        )
        return target

    def verify(self, commitment: Commitment, *, reverify: bool = False) -> VerifiedWeights:
        """Check the directory holds exactly the committed files; hash only what changed."""
        directory = self.path_for(commitment)
        if not directory.is_dir():
            raise WeightsMissingError(
                f"no cached weights {commitment.weights_id} under {self.root}"
            )
        committed = {f.path: f for f in commitment.files}
        present = {p.relative_to(directory).as_posix() for p in model_files(directory)}
        extra = sorted(present - set(committed))
        if extra:
            raise WeightsMismatchError(f"{directory}: files not in the commitment: {extra[:5]}")
        stamps = {} if reverify else self._read_stamps(commitment)
        fresh: dict[str, _Stamp] = {}
        hashed_files = hashed_bytes = 0
        for path, f in sorted(committed.items()):
            file_path = directory / path
            try:
                st = file_path.stat()
            except FileNotFoundError:
                raise WeightsMissingError(f"{file_path}: committed file missing") from None
            stamp = stamps.get(path)
            if stamp is None or not stamp.matches(st) or stamp.sha256 != f.sha256:
                digest = sha256_file(file_path)
                hashed_files += 1
                hashed_bytes += st.st_size
                if digest != f.sha256:
                    self._write_stamps(commitment, fresh)
                    raise WeightsMismatchError(
                        f"{file_path}: sha256 {digest}, committed {f.sha256}"
                    )
                stamp = _Stamp.of(st, digest)
            fresh[path] = stamp
        self._write_stamps(commitment, fresh)
        return VerifiedWeights(directory, hashed_files, hashed_bytes)

    def _read_stamps(self, commitment: Commitment) -> dict[str, _Stamp]:
        try:
            data = json.loads(self._stamp_path(commitment).read_text(encoding="utf-8"))
            return {path: _Stamp(**fields) for path, fields in data.items()}
        except (OSError, ValueError, TypeError):
            return {}

    def _write_stamps(self, commitment: Commitment, stamps: dict[str, _Stamp]) -> None:
        path = self._stamp_path(commitment)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {p: s.__dict__ for p, s in sorted(stamps.items())}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(body, sort_keys=True), encoding="utf-8")
        tmp.replace(path)


def _copy_hashing(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return h.hexdigest()
