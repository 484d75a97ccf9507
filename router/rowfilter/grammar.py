"""The row-filter grammar's tables, shared by ``parser`` (infix forms) and ``terms`` (prefix
forms): binding powers in PostgreSQL's precedence order (``gram.y``), the reserved words that
cannot be unquoted column names, and the type names that may prefix a string literal."""

_CMP_OPS = {"<", ">", "=", "<=", ">=", "<>"}
_OR, _AND, _NOT, _IS, _CMP, _LIKE, _OP, _ADD, _MUL, _POW, _AT, _COLLATE, _UMINUS, _SUB, _CAST = (
    10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150)

# words that cannot be a column name without quotes (a subset of PostgreSQL's reserved list)
_RESERVED = {"and", "or", "not", "is", "null", "true", "false", "in", "between", "like", "ilike",
             "similar", "case", "when", "then", "else", "end", "cast", "array", "any", "all",
             "some", "distinct", "from", "collate", "escape", "select", "exists", "isnull",
             "notnull", "with", "values", "as", "for", "symmetric", "asymmetric", "over"}

# type names that may prefix a string literal (``date '2024-01-01'``)
_TYPE_WORDS = {"int", "integer", "int2", "int4", "int8", "smallint", "bigint", "real", "float",
               "float4", "float8", "double", "numeric", "decimal", "dec", "text", "varchar",
               "char", "character", "bpchar", "boolean", "bool", "date", "time", "timestamp",
               "timestamptz", "interval", "uuid", "bytea", "json", "jsonb", "name", "oid"}
