"""Routing: publications and routes decide which change goes to which topic, as what (plans, row
filters, column lists, truncates, outbox and message routes, transforms, topic names,
transaction metadata).
"""
