"""`pgrouter verify`: a topic folded by key and compared with the source, by bucket digests.
"""
