"""A FastAPI route class that binds simple endpoints' arguments directly, skipping FastAPI's generic solver.

FastAPI's per-request dependency solving (parameter introspection, one validation per parameter, body parsed to
Python objects and validated again) was ~1/3 of the store server's CPU per request under the bench. The endpoints
of the store take only path strings, a few headers and query values, and one pydantic body, so each route builds
a binder once from FastAPI's own analysis (``route.dependant``) and then per request: path params as they are,
headers by alias, query values through a prebuilt TypeAdapter, and the body parsed by orjson and validated with
``model_validate``. FastAPI still generates the OpenAPI spec from the same signature. Validation failures raise the
same ``RequestValidationError`` (loc ``("body", ...)``, ``("query", name)``) as FastAPI would, so the app's
handlers answer 400/422 as before. Anything unusual — a body that is empty or not ``application/json``, or an
endpoint with dependencies, cookies or other parameter kinds — goes through FastAPI's own handler.

Both paths parse bodies with orjson, which follows RFC 8259: ``NaN``, ``Infinity`` and numbers beyond the double
range are not JSON, so they are refused (400, naming where they are) before anything could store them as ``null``
(issue #26). pydantic's own JSON parser reads them as floats; orjson plus ``model_validate`` costs the same as
``model_validate_json`` (21 ms for a body of 1000 spans, here). orjson reads an integer beyond 64 bits as a float,
as the generic path (also orjson) always did; OpenTelemetry attribute integers are 64-bit anyway.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.responses import Response

from agentlightning.store._finite import NO_NONFINITE, describe_float, describe_location, nonfinite_in_refused_json

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

_MISSING: Any = object()


def parse_json_body(raw: bytes) -> Any:
    """A request body parsed by orjson; json.JSONDecodeError when it is not JSON, naming any NaN/Infinity in it."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        found = nonfinite_in_refused_json(exc)
        if found is None:
            raise
        _, location, value = found
        where = describe_location(location) or "the body"
        raise json.JSONDecodeError(f"{where} is {describe_float(value)}; {NO_NONFINITE}", exc.doc, exc.pos) from None


class _OrjsonRequest(Request):
    """Parses JSON bodies with orjson: several times faster than ``json``, and it rejects lone surrogates and NaN."""

    async def json(self) -> Any:
        """The body parsed as JSON (orjson.JSONDecodeError subclasses json.JSONDecodeError, so FastAPI reports 400)."""
        if not hasattr(self, "_json"):
            self._json = parse_json_body(await self.body())
        return self._json


@dataclass(frozen=True, slots=True)
class _Query:
    name: str
    alias: str
    adapter: TypeAdapter[Any]
    default: Any


@dataclass(frozen=True, slots=True)
class _Binder:
    """How to build one endpoint's keyword arguments from a request."""

    path: tuple[str, ...]
    headers: tuple[tuple[str, str], ...]  # (parameter name, header name)
    queries: tuple[_Query, ...]
    body: tuple[str, type[BaseModel]] | None
    request: str | None

    async def bind(self, request: Request) -> dict[str, Any] | None:
        """The endpoint's arguments; None when FastAPI's own handler should take the request."""
        kwargs: dict[str, Any] = {}
        if self.body is not None:
            content_type = request.headers.get("content-type", "")
            if not content_type.startswith("application/json"):
                return None
            raw = await request.body()
            if not raw:
                return None
            name, model = self.body
            try:
                parsed = parse_json_body(raw)
            except json.JSONDecodeError as exc:  # reported as FastAPI's own handler reports it
                error: dict[str, Any] = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error"}
                raise RequestValidationError([{**error, "input": {}, "ctx": {"error": exc.msg}}]) from None
            try:
                kwargs[name] = model.model_validate(parsed)
            except ValidationError as exc:
                raise RequestValidationError(_located(exc, ("body",))) from None
        path_params = request.path_params
        for name in self.path:
            kwargs[name] = path_params[name]
        if self.headers:
            headers = request.headers
            for name, header in self.headers:
                kwargs[name] = headers.get(header)
        if self.queries:
            query = request.query_params
            for param in self.queries:
                value = query.get(param.alias, _MISSING)
                if value is _MISSING:
                    kwargs[param.name] = param.default
                    continue
                try:
                    kwargs[param.name] = param.adapter.validate_python(value)
                except ValidationError as exc:
                    raise RequestValidationError(_located(exc, ("query", param.alias))) from None
        if self.request is not None:
            kwargs[self.request] = request
        return kwargs


def _located(exc: ValidationError, prefix: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{**error, "loc": (*prefix, *error["loc"])} for error in exc.errors(include_url=False)]


def _binder(route: APIRoute) -> _Binder | None:
    """The binder of ``route``, or None when it uses a parameter kind the fast path does not bind."""
    dependant = route.dependant
    # getattr: FastAPI versions differ in which of these the Dependant has; any one present means "not simple".
    special = ("security_requirements", "security_scopes_param_name", "http_connection_param_name")
    special += ("background_tasks_param_name", "response_param_name", "websocket_param_name")
    if (
        dependant.dependencies
        or dependant.cookie_params
        or any(getattr(dependant, name, None) for name in special)
        or len(dependant.body_params) > 1
    ):
        return None
    for field in dependant.path_params:
        if field.field_info.annotation is not str:
            return None
    plain_headers: tuple[Any, ...] = (str, str | None)  # taken as sent; anything else needs FastAPI's conversion
    for field in dependant.header_params:
        if field.field_info.annotation not in plain_headers or field.field_info.default is not None:
            return None
    queries: list[_Query] = []
    for field in dependant.query_params:
        info = field.field_info
        if info.is_required():
            return None
        # The annotation with its constraints (ge, le, ...), as FastAPI validates it.
        shape: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        adapter: TypeAdapter[Any] = TypeAdapter(shape)
        queries.append(_Query(field.name, field.alias, adapter, info.default))
    body: tuple[str, type[BaseModel]] | None = None
    if dependant.body_params:
        field = dependant.body_params[0]
        model = field.field_info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or not field.field_info.is_required():
            return None
        body = (field.name, model)
    return _Binder(
        path=tuple(field.name for field in dependant.path_params),
        headers=tuple((field.name, field.alias) for field in dependant.header_params),
        queries=tuple(queries),
        body=body,
        request=dependant.request_param_name,
    )


class OrjsonRoute(APIRoute):
    """Route whose handler sees an :class:`_OrjsonRequest` (FastAPI's generic handling otherwise)."""

    def get_route_handler(self) -> Handler:
        """Wrap FastAPI's handler so it reads the body through orjson."""
        generic = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await generic(_OrjsonRequest(request.scope, request.receive))

        return handle


class FastRoute(APIRoute):
    """An :class:`APIRoute` whose endpoint gets its arguments from :class:`_Binder` when the request allows it.

    For endpoints that return a :class:`Response` themselves: the fast path does no response-model serialisation.
    """

    def get_route_handler(self) -> Handler:
        """FastAPI's handler (bodies parsed with orjson) behind a direct binder for the ordinary requests."""
        generic = super().get_route_handler()
        binder = _binder(self)
        endpoint: Callable[..., Coroutine[Any, Any, Response]] = self.endpoint

        async def handle(request: Request) -> Response:
            # One request object for both paths: it caches the body, which the ASGI channel gives only once.
            request = _OrjsonRequest(request.scope, request.receive)
            kwargs = None if binder is None else await binder.bind(request)
            if kwargs is None:
                return await generic(request)
            return await endpoint(**kwargs)

        return handle
