"""START_REPLICATION as the slot reader sends it (``router.postgres.identifiers``): the
option values single-quoted as they are, in the command's own text (psycopg2's quoting
without a connection turned ``ü`` into ``?``), a single quote doubled, no ``E''``."""

from router.postgres.identifiers import publication_names, start_replication


def test_option_values_are_kept_as_written():
    opts = {"proto_version": "4", "publication_names": publication_names(
        ["ünï cödé.dot", "it's", "back\\slash", 'a,b "q"'])}
    assert start_replication("s_1", "0/0", opts) == (
        'START_REPLICATION SLOT "s_1" LOGICAL 0/0 ("proto_version" \'4\', '
        '"publication_names" \'"ünï cödé.dot","it\'\'s","back\\slash","a,b ""q"""\')')


def test_no_options():
    assert start_replication("s", "16/B374D848", {}) == \
        'START_REPLICATION SLOT "s" LOGICAL 16/B374D848'
