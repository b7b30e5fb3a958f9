"""Errors the API turns into 4xx answers; each says what is wrong and where."""

from __future__ import annotations


class ApiError(Exception):
    status_code = 400

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class NotFound(ApiError):
    """Unknown job, or a job of another tenant (the two are indistinguishable on purpose)."""

    status_code = 404


class Forbidden(ApiError):
    status_code = 403


class Conflict(ApiError):
    """The job is not in a state where the verb makes sense (e.g. resume a running job)."""

    status_code = 409


class FieldError(ApiError):
    """A request field that cannot be accepted; `problems` lists (field path, message)."""

    status_code = 422

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


class Unavailable(ApiError):
    """The server cannot decide the request now (its token store is unreadable): retry later."""

    status_code = 503
