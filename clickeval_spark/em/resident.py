"""The resident engine: every EM pass of a fit inside one long-running barrier stage.

Each task (at most one per slot of the cluster) decodes its blocks once and keeps their state in its
Python worker. With ``shared`` the tasks share out the candidates instead: each holds every block and
runs every n-th candidate (a selection sample: 18 candidates on a few blocks of unequal size, which
blocks alone cannot balance). Per pass the driver sends the pass plans over a socket and reads back
every block's stats vector; it adds them in block order as the stage engine does, and every block runs
the same `sums.block_pass`: the same sums and parameters, bit for bit, without a Spark job per pass. After the
last pass each task returns its blocks with their chosen candidate's values (of every candidate's values,
num and den, the per-pair table needs only those) as the stage's rows (locally checkpointed; reliably too
with a checkpoint directory).

The driver side is a TCP server on ``spark.driver.host``, as XGBoost's PySpark tracker and
TorchDistributor do it. A task proves itself with a random token from its closure; nothing on the
socket is unpickled: the driver sends JSON, the tasks raw int64 and float64.

Costs: barrier mode needs every task running at once and refuses dynamic allocation, and a barrier
stage restarts whole. A lost task ends the engine (`EngineLost`); the driver then fits again with
the stage engine, whose checkpoints survive a lost executor.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
import struct
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import fields
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark import BarrierTaskContext
from pyspark.sql import DataFrame

from clickeval_spark.em.blocks import PASS_SCHEMA
from clickeval_spark.em.codec import chosen_values
from clickeval_spark.em.layout import checkpointed, release, replicated
from clickeval_spark.em.passes import EngineLost, PassPlan
from clickeval_spark.em.step import BlockArrays, stats_layout
from clickeval_spark.em.sums import block_pass, pass_plans, sum_block_stats
from clickeval_spark.models.base import ClickModel
from clickeval_spark.session import cache_level

_LENGTH = struct.Struct("<q")
_TOKEN_BYTES = 32
#: how long the driver waits for every task to say hello (slots held by another job delay the launch)
CONNECT_TIMEOUT = 300.0
_POLL = 0.5   # seconds between looks at the barrier job while waiting on a socket
_HELLO_LIMIT = 1 << 24   # bytes: the token and a task's block numbers
_HELLO_SECONDS = 10.0    # from connecting to the end of the hello


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)))
    sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, alive=lambda: None) -> bytearray:
    """``n`` bytes; ``alive`` is called whenever the socket times out (it raises to give up)."""
    buf, got = bytearray(n), 0
    view = memoryview(buf)
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            alive()
            continue
        if k == 0:
            raise EngineLost("connection closed")
        got += k
    return buf


def _recv(sock: socket.socket, alive=lambda: None, limit: int | None = None) -> bytearray:
    (n,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size, alive))
    if n < 0 or (limit is not None and n > limit):
        raise EngineLost(f"a message of {n} bytes (at most {limit})")
    return _recv_exact(sock, n, alive)


def _array(a) -> dict:
    a = np.asarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "values": a.ravel().tolist()}   # JSON floats are repr: exact round trips


def _unarray(d: dict) -> np.ndarray:
    return np.array(d["values"], dtype=np.float64).reshape(d["shape"])


def encode_plans(plans: list[PassPlan] | None, chosen: tuple[tuple[int, int], ...] | None = None) -> bytes:
    """A pass's plans as JSON: the tasks parse data, never code (no pickle on a socket). None: finish; the
    tasks then return each block's chosen candidate's values (``chosen``: `Passes.finish`'s), or no state
    when ``chosen`` is None."""
    if plans is None:
        return json.dumps({"command": "finish", "chosen": None if chosen is None else [list(c) for c in chosen]}
                          ).encode()
    return json.dumps({"command": "pass", "plans": [
        {**{f.name: getattr(p, f.name) for f in fields(PassPlan)}, "g": {k: _array(v) for k, v in p.g.items()},
         "update": None if p.update is None else [_array(a) for a in p.update]} for p in plans]}).encode()


def decode_plans(buf) -> list[PassPlan] | None:
    msg = json.loads(bytes(buf))
    if msg["command"] == "finish":
        return None
    return [PassPlan(**{**p, "g": {k: _unarray(v) for k, v in p["g"].items()},
                        "update": None if p["update"] is None else tuple(_unarray(a) for a in p["update"])})
            for p in msg["plans"]]


def _task_fn(model: ClickModel, first_blocks: tuple[int, ...], address: tuple[str, int], token: bytes,
             shared: bool = False):
    """The barrier task: decode the blocks of its partition, then run passes until the driver says finish;
    ``shared``: only the candidates c with c mod (tasks) = its partition (the others' sums are zeros)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = BarrierTaskContext.get()
        share, n_shares = (ctx.partitionId(), len(ctx.getTaskInfos())) if shared else (0, 1)
        kept, ids, arrays, states = [], [], [], []
        for batch in batches:   # the buffers stay valid while their batch is kept
            kept.append(batch)
            data_col, state_col = batch.column("data"), batch.column("state")
            for i, block in enumerate(batch.column("block").to_pylist()):
                ids.append(block)
                arrays.append(BlockArrays.decoded(model, data_col[i].as_buffer()))   # once per fit
                states.append(state_col[i].as_buffer() if state_col[i].is_valid else None)
        vecs: list[np.ndarray] = []
        with socket.create_connection(address) as sock:
            hello = np.array([ctx.partitionId(), ctx.attemptNumber(), len(ctx.getTaskInfos()), len(ids), *ids],
                             dtype=np.int64)
            _send(sock, token + hello.tobytes())
            while True:
                msg = _recv(sock)
                plans = decode_plans(msg)
                if plans is None:   # finish
                    chosen = json.loads(bytes(msg))["chosen"]
                    if chosen is None:   # `end`: the states go nowhere
                        states, vecs = [None] * len(ids), []
                    else:   # one candidate's values, not every candidate's values, num and den
                        states = [chosen_values(s, b, chosen, first_blocks) for s, b in zip(states, ids)]
                    break
                plans, lanes = pass_plans(plans, len(first_blocks))
                lanes = [[c for c in lane if c % n_shares == share] for lane in lanes]
                vecs = []
                for i, block in enumerate(ids):
                    states[i], vec = block_pass(model, plans, lanes, first_blocks, block, arrays[i], states[i])
                    vecs.append(vec)
                _send(sock, b"".join(v.tobytes() for v in vecs))
        done = iter(zip(states, vecs or [None] * len(ids)))
        for batch in kept:
            mine = [next(done) for _ in range(batch.num_rows)]
            # the data goes back empty: the packed log has it, and what reads these rows (`blocks.qd_table`)
            # wants the state (a 10M log's data is 540 MB, which the stage's checkpoint would store again)
            yield pa.RecordBatch.from_arrays(
                [batch.column("block"), pa.array([b""] * batch.num_rows, pa.binary()),
                 pa.array([None if s is None else np.ascontiguousarray(s).tobytes() for s, _ in mine], pa.binary()),
                 pa.array([None if v is None else v.tobytes() for _, v in mine], pa.binary())],
                names=PASS_SCHEMA.fieldNames())

    return run


@contextmanager
def _session_conf(spark, key: str, value: str):
    """``key`` set to ``value`` in the session while the block runs.

    Used for the stage's input batches: one block per Arrow batch, so a task decodes a block while the next
    one arrives, and the executor's Arrow buffer is sized for one block, not grown (by doubling, in fresh
    memory) to all of a task's blocks at once."""
    old = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


class ResidentPasses:
    """The passes of one fit in one barrier stage over ``blocks`` (a packed log's, or PASS_SCHEMA rows), in at
    most ``n_tasks`` tasks (no more than the cluster's slots: `layout.cluster_slots`).

    ``run(plans)`` is one pass, with `stage_passes.run_iteration`'s sums; ``finish(chosen)`` ends the stage and
    returns the blocks with the chosen candidates' values, ``end()`` ends it without them; ``close()`` cancels the stage
    if it is still running.
    """

    def __init__(self, blocks: DataFrame, model: ClickModel, M: int, first_blocks: tuple[int, ...],
                 n_tasks: int, *, shared: bool = False, connect_timeout: float = CONNECT_TIMEOUT):
        self.model, self.M = model, M
        spark = blocks.sparkSession
        self._sc = spark.sparkContext
        conf = self._sc.getConf()
        host = conf.get("spark.driver.host")
        self._server = socket.create_server((conf.get("spark.driver.bindAddress") or host, 0))
        self._server.settimeout(_POLL)
        token = secrets.token_bytes(_TOKEN_BYTES)
        rows = blocks.select(*PASS_SCHEMA.fieldNames())
        self.shared = shared
        # a barrier stage may not change its number of partitions (no coalesce): a shuffle to one per task
        if shared:
            rows = replicated(rows, n_tasks)
        elif rows.rdd.getNumPartitions() != n_tasks:
            rows = rows.repartitionByRange(n_tasks, "block")
        stage = rows.mapInArrow(_task_fn(model, first_blocks, (host, self._server.getsockname()[1]), token, shared),
                                PASS_SCHEMA, barrier=True)
        self._group = f"clickeval-resident-{uuid.uuid4().hex}"
        self._final: DataFrame | None = None
        self._finished: DataFrame | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._materialise, args=(stage,), name=self._group, daemon=True)
        self._conns: list[tuple[socket.socket, list[int]]] = []
        self.n_tasks = 0
        try:
            # the stage is planned in its thread, which reads the batch size then; every task is running
            # when the last one says hello, so the session's own size is back before anything else is planned
            with _session_conf(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "1"):
                self._thread.start()
                self._accept(token, connect_timeout)
        except BaseException:
            self.close()
            raise

    def _materialise(self, stage: DataFrame) -> None:
        """The barrier job (in its own thread): it runs until the driver sends finish."""
        self._sc.setJobGroup(self._group, "clickeval resident EM passes", interruptOnCancel=True)
        try:
            self._final = stage.localCheckpoint(eager=True, storageLevel=cache_level(stage.sparkSession, None))
        except BaseException as e:   # reported to the driver's waits
            self._error = e

    def _alive(self) -> None:
        if not self._thread.is_alive() and self._final is None:
            raise EngineLost(f"the barrier stage ended: {self._error!r}") from self._error

    def _hello_alive(self, deadline: float) -> None:
        self._alive()
        if time.monotonic() > deadline:
            raise EngineLost("no hello before the deadline")

    def _accept(self, token: bytes, timeout: float) -> None:
        """Every task's connection: as many as the stage has tasks (a range repartition of few blocks may
        make fewer partitions than asked for), each with its block numbers."""
        deadline = time.monotonic() + timeout
        seen, n_tasks = set(), None
        while n_tasks is None or len(self._conns) < n_tasks:
            try:
                conn, _ = self._server.accept()
            except socket.timeout:
                self._alive()
                if time.monotonic() > deadline:
                    raise EngineLost(f"{len(self._conns)} of {n_tasks or '?'} tasks connected within {timeout:.0f} s")
                continue
            conn.settimeout(_POLL)
            said_by = min(deadline, time.monotonic() + _HELLO_SECONDS)
            try:   # a stranger on the port gets a few seconds and a few MB to say hello, no more
                hello = _recv(conn, lambda: self._hello_alive(said_by), limit=_HELLO_LIMIT)
            except EngineLost:
                self._alive()
                conn.close()
                continue
            if not hmac.compare_digest(bytes(hello[:_TOKEN_BYTES]), token):
                conn.close()   # not one of ours
                continue
            partition, attempt, n_tasks, n, *ids = np.frombuffer(hello, dtype=np.int64, offset=_TOKEN_BYTES).tolist()
            if partition in seen or len(ids) != n:
                conn.close()
                raise EngineLost(f"task {partition} (attempt {attempt}) joined twice: the stage restarted")
            seen.add(partition)
            self._conns.append((conn, ids))
        self.n_tasks = n_tasks

    def run(self, plans: list[PassPlan]) -> list[dict[str, np.ndarray] | None]:
        """One pass: every block's stats, summed in block order per candidate (None for a held one)."""
        self._alive()   # a task killed with its JVM side (a cancel) may leave its Python worker answering
        payload = encode_plans(list(plans))
        size = len(plans) * sum(n for _, n in stats_layout(self.model, self.M))
        by_block = {}
        self._send_all(payload)
        try:
            for conn, ids in self._conns:
                vecs = np.frombuffer(_recv(conn, self._alive), dtype=np.float64)
                if vecs.size != len(ids) * size:
                    raise EngineLost(f"a task sent {vecs.size} sums, expected {len(ids) * size}")
                for b, vec in zip(ids, vecs.reshape(len(ids), size)):
                    # shared candidates: each task's zeros where the candidate is another's, so x + 0 = x
                    by_block[b] = by_block[b] + vec if b in by_block else vec
        except ConnectionError as e:   # a task's end of the socket went away with it
            raise EngineLost(f"a task's connection failed: {e!r}") from e
        return sum_block_stats(self.model, self.M, plans, (by_block[b] for b in sorted(by_block)))

    def _send_all(self, payload: bytes) -> None:
        """``payload`` to every task; a connection that went away with its task ends the engine."""
        try:
            for conn, _ in self._conns:
                _send(conn, payload)
        except (ConnectionError, socket.timeout) as e:   # timeout: a task that stopped reading
            raise EngineLost(f"a task's connection failed: {e!r}") from e

    def finish(self, chosen: tuple[tuple[int, int], ...]) -> DataFrame:
        """End the stage: the blocks as PASS_SCHEMA rows with the chosen candidates' values (`Passes.finish`;
        their data empty), checkpointed."""
        if self.shared:   # every task has every block, each with its own candidates' state
            raise ValueError("ResidentPasses.finish: a stage of shared candidates has no one state per block; end() it")
        final = self._end_stage(tuple(chosen))
        if self._sc.getCheckpointDir() is not None:
            # a lost executor's final state is read back, not recomputed by the stage
            self._final = checkpointed(final)
            release(final)
        self._finished = self._final
        return self._finished

    def end(self) -> None:
        """End the stage as `finish` does, but the tasks return no state: a selection sample's 18 candidates'
        states are hundreds of MB per block (DBN), which a 1g executor cannot take in as one row."""
        release(self._end_stage(None))
        self._final = None

    def _end_stage(self, chosen: tuple[tuple[int, int], ...] | None) -> DataFrame:
        """Tell the tasks to finish, wait for the barrier job, close the sockets: the job's rows."""
        self._send_all(encode_plans(None, chosen))
        self._thread.join()
        self._alive()
        self._stop()
        return self._final

    def close(self) -> None:
        """Cancel the stage if it still runs, close every socket, release the finished blocks."""
        self._stop()
        if self._finished is not None:
            release(self._finished)
            self._finished = None

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._sc.cancelJobGroup(self._group)
        for conn, _ in self._conns:
            conn.close()
        self._conns = []
        self._server.close()
        if self._thread.ident is not None:   # (started)
            self._thread.join(timeout=60)
