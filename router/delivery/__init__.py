"""Delivery: Kafka's acknowledgements to the confirmed position, exactly-once, and which of
several routers is the one that delivers.
"""
