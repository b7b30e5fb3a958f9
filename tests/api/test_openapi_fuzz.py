"""Schemathesis against the published /openapi.json, in process over ASGI: generated
requests (valid and invalid, with a tenant's and an admin's token) never get a 5xx, and
every answer matches the documented status codes, content type and response schema."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import auth

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Bounded so the area stays within its time budget; derandomized so CI sees the same cases.
EXAMPLES = 60


def test_generated_requests_get_no_5xx_and_match_the_schema(client, tokens, seed_body):
    app = client.app
    job_id = client.post("/v1/training/jobs", json=seed_body,
                         headers=auth(tokens["prod"])).json()["job_id"]
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    cases = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE),
        schema.as_strategy(GenerationMode.NEGATIVE),
        # the real job, so the routes behind the 404 run too
        schema.as_strategy(GenerationMode.POSITIVE, path_parameters={"job_id": job_id}),
    )
    callers = st.sampled_from([tokens["prod"], tokens["research"], tokens["admin"]])

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases, token=callers)
    def run(case, token):
        case.call_and_validate(headers=auth(token), checks=CHECKS)

    run()
