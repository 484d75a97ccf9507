"""Build of the optional C extensions (everything else is in pyproject.toml): the accelerator
``router._native`` and ``actors.kafka._producer`` (librdkafka's producer driven from C for an
initial snapshot's packed records; it links nothing: it opens the librdkafka confluent-kafka
loaded).

Both are optional: without a C compiler pgrouter installs and runs on its Python code alone
(slower; the router's ``starting`` log line says which: ``hot_path=native``)."""

from setuptools import Extension, setup

SOURCES = ["module.c", "stream/pgoutput.c", "stream/short.c", "formats/codec.c",
           "formats/recorder.c", "formats/tx.c", "delivery/delivery.c", "formats/avro.c",
           "formats/avro_values.c", "verify/verify.c", "snapshot/copytext.c",
           "snapshot/copyrecords.c", "verify/verify_fold.c", "verify/verify_copy.c",
           "verify/verify_json.c", "verify/verify_digest.c"]

setup(ext_modules=[Extension("router._native", [f"router/_native/{name}" for name in SOURCES],
                             depends=["router/_native/formats/avro_values.h",
                                      "router/_native/formats/codec.h",
                                      "router/_native/formats/json.h", "router/_native/native.h",
                                      "router/_native/pyrefs.h",
                                      "router/_native/snapshot/copytext.h",
                                      "router/_native/verify/verify.h"],
                             optional=True, extra_compile_args=["-O2", "-Wall"]),
                   Extension("actors.kafka._producer", ["actors/kafka/_producer.c"],
                             depends=["router/_native/pyrefs.h"], libraries=["dl", "pthread"], optional=True,
                             extra_compile_args=["-O2", "-Wall"])])
