"""The optional C accelerator of the per-change hot path (``router/_native/``, one module).

Rules:

* The Python code is the reference; the accelerator returns ``None`` wherever its input is
  not the plain case it handles, and the Python code then runs (and raises the precise
  error). Outputs are identical byte for byte (``tests/router/test_native.py``).
* It is built by ``pip install`` when a C compiler is there (``setup.py``); without one,
  ``NATIVE`` is None and pgrouter runs on its Python code alone.
* ``PGROUTER_PURE_PYTHON=1`` in the environment turns it off (to compare the two).
* ``TWINS`` is the one list of fast lanes: every public function and type of
  ``router._native`` (but ``configure``) with its Python reference, which
  ``tests/router/test_native_twins.py`` compares it with.
* ``IO_TWINS`` lists the C extensions of ``actors/`` (I/O, so no byte-for-byte differential
  with fakes): each with its Python twin, the test that holds the two to the same outcome
  against the real service, and what the C buys as measured (the bench command).
"""

from __future__ import annotations

import os


def _load():
    if os.environ.get("PGROUTER_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _native
    except ImportError:
        return None
    if not hasattr(_native, "configure"):
        # not built: ``router/_native/`` (its C sources) imports as an empty namespace
        # package from a checkout, which is no accelerator
        return None
    return _native  # router.pgoutput.reader configures it (UNCHANGED_TOAST, MAX_COLUMNS)


#: the ``router._native`` module, or None when it is not built or turned off
NATIVE = _load()

#: the fast lanes: name -> (the Python reference as ``module:attribute``, the attribute of
#: ``router._native`` that computes the same). Strings, not imports: two references live
#: in ``actors/``, which router/ never imports.
TWINS: dict[str, tuple[str, str]] = {
    "read_tuple": ("router.pgoutput.reader:read_tuple_py", "read_tuple"),
    "decode_row": ("router.pgoutput.decode:Decoder.decode", "decode_row"),
    "feed_rows": ("router.stream.short_transactions:feed_row", "feed_rows"),
    "take_short": ("router.stream.short_transactions:take_short", "take_short"),
    "row_codec": ("router.formats.envelope:TableEncoder._encode_py", "RowCodec"),
    "tx_bits": ("router.formats.envelope:TableEncoder._use_tx", "tx_bits"),
    "recorder": ("router.formats.recorders:PyRecorder", "Recorder"),
    "outbox_recorder": ("router.routing.outbox:PyOutboxRecorder", "OutboxRecorder"),
    "record_run": ("router.routing.dispatch:_record_run_py", "record_run"),
    "tally": ("router.delivery.tally:PyTally", "Tally"),
    "drain": ("actors.pipeline.slot_reader:_drain_py", "drain"),
    "hand_over": ("actors.kafka.librdkafka:_hand_over_py", "hand_over"),
    "avro": ("router.formats.avro:AvroFormat._convert_all_py", "AvroConverter"),
    "verify_row": ("router.verify.digests:row_digests_py", "verify_row"),
    "copy_rows": ("router.snapshot.core:copy_rows_py", "copy_rows"),
    "copy_records": ("router.snapshot.rows:copy_records_py", "copy_records"),
    "verify_fold": ("router.verify.digests:fold_batch_py", "verify_fold"),
    "verify_copy": ("router.verify.digests:copy_sums_py", "verify_copy"),
    "verify_sums": ("router.verify.digests:bucket_sums_py", "verify_sums"),
}

#: C extensions outside ``router._native``: the extension (``module:type``) -> (its Python
#: twin, the test comparing the two against the real service, what it buys). Every C file of
#: ``actors/`` has its entry (``tests/router/test_native_twins.py``).
IO_TWINS: dict[str, tuple[str, str, str]] = {
    # a snapshot's packed records handed to a librdkafka producer of its own from C, no Python
    # object a record and no GIL; the twin is the same client's per-record produce of the
    # records unpacked (what runs when the extension is not built or librdkafka is not found)
    "actors.kafka._producer:Producer": (
        "actors.kafka.librdkafka:RdKafkaClient.produce",
        "tests/integration/test_sink_clients.py",
        "producer alone, 500k records: 1.31x records/s, 0.53x CPU s (median of 5: 2.24 s, "
        "0.72 CPU s against 2.94 s, 1.37 CPU s; load 3.9-5.4 on 2 cores): "
        "bench/snapshot.py --ceilings --rows 500000 --repeat 5"),
}


def describe() -> str:
    """One word for logs and ``pgrouter check``."""
    return "native" if NATIVE is not None else "python"
