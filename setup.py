"""Build of the optional C extensions (everything else is in pyproject.toml): the accelerator
``router._native`` and ``actors.kafka._producer`` (librdkafka's producer driven from C for an
initial snapshot's packed records; it links nothing: it opens the librdkafka confluent-kafka
loaded).

Both are optional: without a C compiler pgrouter installs and runs on its Python code alone
(slower; the router's ``starting`` log line says which: ``hot_path=native``)."""

from setuptools import Extension, setup

SOURCES = ["module.c", "pgoutput.c", "short.c", "codec.c", "recorder.c", "tx.c", "delivery.c",
           "avro.c", "avro_values.c", "verify.c", "copytext.c", "copyrecords.c", "verify_fold.c",
           "verify_copy.c", "verify_json.c", "verify_digest.c"]

setup(ext_modules=[Extension("router._native", [f"router/_native/{name}" for name in SOURCES],
                             depends=["router/_native/native.h", "router/_native/codec.h",
                                      "router/_native/json.h", "router/_native/avro_values.h",
                                      "router/_native/copytext.h", "router/_native/verify.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"]),
                   Extension("actors.kafka._producer", ["actors/kafka/_producer.c"],
                             libraries=["dl", "pthread"], optional=True,
                             extra_compile_args=["-O2", "-Wall"])])
