"""JSON request bodies: strict decoding, and their documentation in the OpenAPI schema.

Litestar's own body conversion is lax (it turns `"7"` into 7 and `1` into true), while
PROTOCOL §5 wants a 400 naming a field of the wrong type. So handlers decode the raw
body with msgspec here, and declare the body type in `opt={"json_body": Type}` so it
still appears in the OpenAPI document (which schemathesis and clients rely on).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec
from litestar import Litestar, Request
from litestar.openapi.spec import OpenAPIMediaType, Reference, RequestBody

from relay.errors import bad_request
from shared_format.errors import WireDecodeError
from shared_format.wire import decode_json

T = TypeVar("T")
BODY_OPT: Final = "json_body"
OPTIONAL_BODY_OPT: Final = "json_body_optional"


async def decode_body(
    request: Request[Any, Any, Any], type_: type[T], *, empty_ok: bool = False
) -> T:
    """Strict JSON decoding of the body: 400 naming the field, never a lax coercion."""
    body = await request.body()
    if empty_ok and not body.strip():
        body = b"{}"
    try:
        return decode_json(body, type_)
    except WireDecodeError as exc:
        message = str(exc)
        if message.startswith("malformed JSON"):
            raise bad_request(
                f"request body is not valid JSON: {message}", code="malformed_json"
            ) from None
        field = (exc.field or "$").removeprefix("$").removeprefix(".") or "body"
        raise bad_request(
            f"invalid request: {message}", code="invalid_request", field=field
        ) from None


def document_json_bodies(app: Litestar) -> None:
    """Add the request bodies declared with `opt={"json_body": Type}` to the OpenAPI schema."""
    declared: dict[tuple[str, str], tuple[type[Any], bool]] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            body_type = handler.opt.get(BODY_OPT)
            if body_type is None:
                continue
            for method in handler.http_methods:
                declared[(route.path_format, method.lower())] = (
                    body_type,
                    not handler.opt.get(OPTIONAL_BODY_OPT, False),
                )
    if not declared:
        return
    types = sorted({t for t, _ in declared.values()}, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    schema = app.openapi_schema
    if schema.components.schemas is None:
        schema.components.schemas = {}
    for name, component in components.items():
        schema.components.schemas.setdefault(name, component)
    ref_of = dict(zip(types, refs, strict=True))
    for (path, method), (body_type, required) in declared.items():
        path_item = schema.paths.get(path) if schema.paths else None
        operation = getattr(path_item, method, None) if path_item else None
        if operation is None:
            continue
        operation.request_body = RequestBody(
            content={
                "application/json": OpenAPIMediaType(
                    schema=Reference(ref=ref_of[body_type]["$ref"])
                )
            },
            required=required,
        )
