"""The training-jobs REST API (FastAPI); its OpenAPI document is served at /openapi.json.

    app = create_app(plane, tokens)          # see fm_pipeline.cli.api for `fm api serve`

Every /v1 route needs `Authorization: Bearer <token>` (401 otherwise). Errors are JSON:
`{"detail": "..."}`, or for bad fields `{"detail": [{"loc": ["body", "gpus"], "msg": ...,
"type": ...}]}` with status 422. Bodies over the size limit get 413.
"""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager

from fastapi import Body, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fm_pipeline.api.auth import Principal, TokenStore, TokenStoreUnreadable
from fm_pipeline.api.control_plane import ControlPlane
from fm_pipeline.api.errors import ApiError, FieldError, Forbidden, Unavailable
from fm_pipeline.api.limits import DEFAULT_MAX_BODY_BYTES, BodySizeLimit
from fm_pipeline.api.schemas import (
    CheckpointInfo,
    CheckpointList,
    EvaluationList,
    EventList,
    JobAccepted,
    JobSubmitted,
    JobCreate,
    JobList,
    JobStatus,
    JobStatusName,
    Message,
    ResumeBody,
    TenantList,
    ValidationProblems,
)

log = logging.getLogger(__name__)
JOB_ID = Path(pattern=r"^[a-z0-9-]{1,64}$", description="the job_id returned at submission")
_ERRORS = {
    400: {"model": Message, "description": "a body that cannot be parsed (not UTF-8 JSON)"},
    401: {"model": Message, "description": "no token, or an unknown one"},
    404: {"model": Message, "description": "no such job (or another tenant's)"},
    413: {"model": Message, "description": "request body over the size limit"},
    422: {"model": ValidationProblems, "description": "a field that cannot be accepted"},
}


def _errors(*codes: int, extra: dict | None = None) -> dict:
    chosen = {c: _ERRORS[c] for c in (400, 401, 413, 422, *codes)}
    return {**chosen, **(extra or {})}


def create_app(plane: ControlPlane, tokens: TokenStore, *,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, tick_s: float | None = None) -> FastAPI:
    """The API over `plane`. `tick_s`: reconcile in the background every so many seconds."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = threading.Event()
        ticker = None
        if tick_s:
            ticker = threading.Thread(target=_tick, args=(plane, stop, tick_s), daemon=True,
                                      name="fm-api-reconcile")
            ticker.start()
        yield
        stop.set()
        if ticker is not None:
            ticker.join(timeout=10)

    app = FastAPI(
        title="fm-pipeline control plane",
        version="1",
        description="Training jobs for tenants with quotas, fair share, priorities and preemption.",
        lifespan=lifespan,
    )
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description="a tenant's or an admin's API token")

    def caller(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
        try:
            who = tokens.verify(credentials.credentials) if credentials else None
        except TokenStoreUnreadable as e:
            raise Unavailable(f"the token store cannot be read: {e}") from None
        if who is None:
            raise _Unauthorized()
        known = plane.tenants.tenant_names
        if who.tenant is not None and who.tenant not in known:
            raise Forbidden(f"token {who.token_id} belongs to tenant {who.tenant!r}, which this "
                            f"server's tenants do not include ({', '.join(known)}); ask an "
                            "admin to add the tenant or issue a token for one of those")
        return who

    @app.exception_handler(_Unauthorized)
    async def _unauthorized(request: Request, exc: _Unauthorized):
        return JSONResponse({"detail": "a valid bearer token is required"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(FieldError)
    async def _field_error(request: Request, exc: FieldError):
        detail = [{"loc": ["body", *_loc(field)], "msg": msg, "type": "value_error"}
                  for field, msg in exc.problems]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        # The field and the rule only: the offending input is not echoed back.
        detail = [{"loc": [str(p) if not isinstance(p, int) else p for p in e["loc"]],
                   "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.get("/healthz", response_model=Message, tags=["service"])
    def healthz() -> Message:
        return Message(detail="ok")

    @app.post("/v1/training/jobs", status_code=201, response_model=JobSubmitted, tags=["jobs"],
              response_model_exclude_unset=True,
              responses=_errors(extra={
                  403: {"model": Message, "description": "admin tokens own no jobs"},
                  409: {"model": Message, "description": "Idempotency-Key reused for another body"}}))
    def submit_job(body: JobCreate, response: Response, who: Principal = Depends(caller),
                   idempotency_key: str | None = Header(
                       None, alias="Idempotency-Key", min_length=1, max_length=128,
                       pattern=r"^[A-Za-z0-9._:-]+$",
                       description="a retry with the same key and body within 24 h gets the "
                                   "same job (Idempotent-Replayed: true), never a second one"),
                   ) -> JobSubmitted:
        record, warnings, replayed = plane.submit_with_warnings(
            who, body, idempotency_key=idempotency_key)
        if replayed:
            response.headers["Idempotent-Replayed"] = "true"
        # The seed's {job_id, status} exactly, unless the planner has something to say.
        return JobSubmitted(job_id=record.job_id, status="queued",
                            **({"warnings": warnings} if warnings else {}))

    @app.get("/v1/training/jobs", response_model=JobList, tags=["jobs"], responses=_errors())
    def list_jobs(
        who: Principal = Depends(caller),
        tenant: str | None = Query(None, pattern=r"^[a-z0-9-]{1,40}$"),
        status: JobStatusName | None = Query(None),
    ) -> JobList:
        return JobList(jobs=[JobStatus(**j) for j in plane.list_jobs(who, tenant=tenant, status=status)])

    @app.get("/v1/training/jobs/{job_id}", response_model=JobStatus, tags=["jobs"],
             responses=_errors(404))
    def get_job(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> JobStatus:
        return JobStatus(**plane.status(who, job_id))

    conflict = {409: {"model": Message, "description": "the job is not in a state for this"}}

    @app.post("/v1/training/jobs/{job_id}/resume", status_code=202, response_model=JobAccepted,
              tags=["jobs"], responses=_errors(404, extra=conflict))
    def resume_job(job_id: str = JOB_ID, body: ResumeBody | None = Body(None),
                   who: Principal = Depends(caller)) -> JobAccepted:
        status = plane.resume(who, job_id, body.checkpoint if body else None)
        return JobAccepted(job_id=job_id, status=status)

    @app.post("/v1/training/jobs/{job_id}/cancel", status_code=202, response_model=JobAccepted,
              tags=["jobs"], responses=_errors(404, extra=conflict))
    def cancel_job(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> JobAccepted:
        return JobAccepted(job_id=job_id, status=plane.cancel(who, job_id))

    @app.post("/v1/training/jobs/{job_id}/preempt", status_code=202, response_model=JobAccepted,
              tags=["admin"], responses=_errors(404, extra={
                  **conflict, 403: {"model": Message, "description": "needs an admin token"}}))
    def preempt_job(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> JobAccepted:
        return JobAccepted(job_id=job_id, status=plane.preempt(who, job_id))

    @app.get("/v1/training/jobs/{job_id}/checkpoints", response_model=CheckpointList,
             tags=["jobs"], responses=_errors(404))
    def list_checkpoints(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> CheckpointList:
        seen = plane.checkpoints(who, job_id)
        return CheckpointList(checkpoints=[
            CheckpointInfo(step=c.step, location=c.location, tier=c.tier, committed=c.committed,
                           tokens_seen=c.tokens_seen, created_at=c.created_at,
                           total_bytes=c.total_bytes, problem=c.problem, marks=list(c.marks),
                           superseded=c.superseded)
            for c in seen
        ])

    @app.get("/v1/training/jobs/{job_id}/evaluations", response_model=EvaluationList,
             tags=["jobs"], responses=_errors(404))
    def list_evaluations(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> EvaluationList:
        return EvaluationList(evaluations=plane.evaluations(who, job_id))

    @app.get("/v1/training/jobs/{job_id}/events", response_model=EventList, tags=["jobs"],
             responses=_errors(404))
    def list_events(job_id: str = JOB_ID, who: Principal = Depends(caller)) -> EventList:
        return EventList(events=plane.events(who, job_id))

    @app.get("/v1/tenants", response_model=TenantList, tags=["tenants"], responses=_errors())
    def tenants(who: Principal = Depends(caller)) -> TenantList:
        return TenantList(pool_gpus=plane.tenants.pool["gpu"], tenants=plane.tenant_usage(who))

    return app


class _Unauthorized(Exception):
    pass


def _loc(field: str) -> list[str]:
    return field.split(".")


def _tick(plane: ControlPlane, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        try:
            plane.reconcile()
        except Exception:  # keep ticking: one bad reconcile must not stop the queue
            log.exception("reconcile failed")
