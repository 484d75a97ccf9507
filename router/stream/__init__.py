"""The stream: decoded pgoutput messages in, whole committed transactions out (short ones in one
step), the relation cache, origin policies.
"""
