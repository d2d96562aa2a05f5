"""The lock of a results directory on an object store: a lease object that the live run renews.

An object store has no file locks and no atomic rename, and a killed driver never releases anything, so the lock
``DIR/.lock`` is a *lease*: a small JSON object (host, pid, a random token, ``expires_at``) that the holder
rewrites every ``lease_s / 3`` seconds with a later expiry (a thread of the driver), and deletes at the end.  A run
that finds an unexpired lease is refused; one that finds an expired lease (its holder was killed, or lost its
network for longer than ``lease_s``) takes it over.

Taking, renewing, taking over and deleting are **conditional writes** where the store has them, so that of two
drivers starting together exactly one holds the lease:

- **S3** (AWS since 2024, and S3-compatible servers implementing ``If-None-Match`` / ``If-Match`` on PUT and
  ``If-Match`` on DELETE: MinIO, moto 5): through ``boto3``, since ``pyarrow.fs.S3FileSystem`` exposes no
  conditional write.  A new lease is a PUT with ``If-None-Match: *`` (refused when the object exists); a renewal,
  a takeover of an expired lease and the final DELETE carry ``If-Match: <ETag of the version read>`` (refused
  when another driver wrote it meanwhile).
- **Other stores** (GCS, Azure, HDFS through pyarrow; S3 without ``boto3`` installed): pyarrow offers no
  precondition, so the lease is written, read back after a pause and kept only if it is still ours: this
  narrows the race but cannot close it (a warning says so; run one driver per --out at a time there).

Expiry is compared with the reading driver's clock: hosts' clocks must agree to well within ``lease_s``
(60 s by default; NTP keeps them within milliseconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ursa_ray.grid import GridError
from ursa_ray.results import Location

LEASE_S = 60.0
"""How long a lease lasts unless renewed; the holder renews it every third of that."""


class LeaseRefused(GridError):
    """Another live run holds the lease (one line, exit status 2)."""


class ConditionalStore:
    """An object store's conditional writes on one key (S3 through boto3).  Each write returns the new ETag,
    or None when its precondition failed."""

    atomic = True

    def __init__(self, where: Location):
        import boto3
        from botocore.config import Config

        query = {k: v[-1] for k, v in parse_qs(urlsplit(where.uri).query).items()}
        endpoint = query.get("endpoint_override")
        if endpoint and "://" not in endpoint:
            endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=query.get("region") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            aws_access_key_id=query.get("access_key"),
            aws_secret_access_key=query.get("secret_key"),
            config=Config(retries={"max_attempts": 3}),
        )
        self.bucket, _, self.key = where.path.partition("/")
        from botocore.exceptions import ClientError

        self._client_error = ClientError

    def _refused(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")

    def read(self) -> tuple[bytes, str] | None:
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self._client_error as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return answer["Body"].read(), answer["ETag"]

    def write(self, body: bytes, etag: str | None) -> str | None:
        """Create (``etag`` None: only if absent) or replace (only if still at ``etag``)."""
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=body, **condition)["ETag"]
        except self._client_error as exc:
            if self._refused(exc) or exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                return None
            raise

    def delete(self, etag: str) -> None:
        with contextlib.suppress(self._client_error):  # refused: another driver took it over meanwhile
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=etag)


class BestEffortStore:
    """A store without conditional writes (through pyarrow): write, pause, read back; the ETag is the body."""

    atomic = False
    settle_s = 1.0

    def __init__(self, where: Location):
        self.where = where

    def read(self) -> tuple[bytes, str] | None:
        if not self.where.exists():
            return None
        body = self.where.read_bytes()
        return body, body.decode(errors="replace")

    def write(self, body: bytes, etag: str | None) -> str | None:
        current = self.read()
        if (current is None) != (etag is None) or (current is not None and current[1] != etag):
            return None
        self.where.write_bytes(body)
        time.sleep(self.settle_s)  # a driver that wrote at the same moment has overwritten ours by now
        after = self.read()
        return after[1] if after is not None and after[0] == body else None

    def delete(self, etag: str) -> None:
        current = self.read()
        if current is not None and current[1] == etag:
            self.where.fs.delete_file(self.where.path)


def store_for(where: Location) -> ConditionalStore | BestEffortStore:
    """S3 with boto3: conditional writes; anything else: best effort."""
    if where.uri.startswith("s3://"):
        try:
            return ConditionalStore(where)
        except ImportError:
            pass
    return BestEffortStore(where)


class Lease:
    """The lease ``where`` (``DIR/.lock`` on an object store) for one run: :meth:`held` takes it (or raises
    :class:`LeaseRefused`), renews it from a thread while the block runs, and deletes it at the end."""

    def __init__(
        self, where: Location, echo: Callable[[str], None] = print, lease_s: float = LEASE_S, store: Any = None
    ):
        self.where, self.echo, self.lease_s = where, echo, lease_s
        self.store = store if store is not None else store_for(where)
        self.record = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
                       "started_at": time.time(), "expires_at": 0.0, "lease_s": lease_s}  # fmt: skip
        self.etag: str | None = None
        self.lost = False

    @contextlib.contextmanager
    def held(self) -> Iterator[Lease]:
        if not self.store.atomic:
            self.echo(
                f"warning: {self.where.parent}: this object store has no conditional writes: two runs "
                "starting at the same moment on this --out could both proceed; run one at a time"
            )
        self._take()
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew_until, args=(stop,), name="ursa-ray-lease", daemon=True)
        renewer.start()
        try:
            yield self
        finally:
            stop.set()
            renewer.join()
            if not self.lost and self.etag is not None:
                self.store.delete(self.etag)

    def _body(self) -> bytes:
        self.record["expires_at"] = time.time() + self.lease_s
        return json.dumps(self.record).encode()

    def _take(self) -> None:
        for _ in range(5):
            self.etag = self.store.write(self._body(), None)
            if self.etag is not None:
                return
            current = self.store.read()
            if current is None:
                continue  # released meanwhile: try again
            holder = _holder(current[0])
            if float(holder.get("expires_at", 0.0)) > time.time():
                raise self._refusal(holder)
            self.etag = self.store.write(self._body(), current[1])
            if self.etag is None:  # another driver took the expired lease first
                raise self._refusal(_holder((self.store.read() or (b"", ""))[0]))
            self.echo(
                f"{self.where.parent}: taking over the expired lock of {_describe(holder)} (not renewed "
                f"since {_when(float(holder.get('expires_at', 0.0)) - float(holder.get('lease_s', self.lease_s)))})"
            )
            return
        raise LeaseRefused(f"{self.where.parent}: could not take its lock {self.where}; try again")

    def _renew_until(self, stop: threading.Event) -> None:
        while not stop.wait(self.lease_s / 3):
            etag = self.store.write(self._body(), self.etag)
            if etag is None:
                self.lost = True
                self.echo(
                    f"warning: {self.where.parent}: this run's lock was taken by another run (not renewed "
                    f"within {self.lease_s:g} s): stop one of them"
                )
                return
            self.etag = etag

    def _refusal(self, holder: dict[str, Any]) -> LeaseRefused:
        return LeaseRefused(
            f"{self.where.parent}: in use by another ursa-ray run ({_describe(holder)}, its lease renewed until "
            f"{_when(float(holder.get('expires_at', 0.0)))}); wait for it to end, use another --out, or delete "
            f"{self.where} if no run is using it"
        )


def _holder(body: bytes) -> dict[str, Any]:
    try:
        holder = json.loads(body)
        return holder if isinstance(holder, dict) else {}
    except ValueError:
        return {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a run whose lock is unreadable"
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {_when(float(holder.get('started_at', 0.0)))}"


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
