"""The records: pgrouter's JSON envelope, Kafka Connect and Avro, their schemas and the values in
them.
"""
