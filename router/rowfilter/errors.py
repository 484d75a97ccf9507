"""Errors a compiled row filter raises while evaluating a row.

Compile-time problems are ``router.errors.FilterError`` (a ``ConfigError``). A filter that fails
at run time (division by zero, integer overflow) is what PostgreSQL would report by erroring out
the walsender: that is not the user's configuration being wrong, and retrying reads the same
row again, so it gets its own type here.
"""

from __future__ import annotations

from router.errors import PgRouterError


class FilterEvaluationError(PgRouterError):
    """Evaluating a row filter failed the way PostgreSQL's would (``division by zero``,
    ``integer out of range``…). ``sqlstate`` is PostgreSQL's error code for the same failure."""

    def __init__(self, message: str, *, sqlstate: str = "22000"):
        self.sqlstate = sqlstate
        super().__init__(message)


def division_by_zero() -> FilterEvaluationError:
    return FilterEvaluationError("division by zero", sqlstate="22012")


def out_of_range(type_name: str) -> FilterEvaluationError:
    return FilterEvaluationError(f"{type_name} out of range", sqlstate="22003")
