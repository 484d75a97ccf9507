"""The configuration files (`pgrouter run`'s, `pgrouter apply`'s, the console's), decoded and
checked once.
"""
