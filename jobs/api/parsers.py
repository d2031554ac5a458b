"""The API's JSON parser: DRF's, with a bound on how deep a request body may nest."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from jobs.rules import nesting


class BoundedJSONParser(JSONParser):
    """A body nested deeper than jobs.rules.nesting.MAX_DOCUMENT_NESTING is a 400 naming the
    top-level fields that are (or `detail` when it is too deep for the decoder itself
    or not an object), before any view or serializer walks it."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            with nesting.decoding():
                data = super().parse(stream, media_type, parser_context)
        except nesting.TooDeep as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            nesting.check_document(data)
        except nesting.TooDeep as exc:
            raise ParseError(nesting.too_deep_fields(data) if isinstance(data, dict) else str(exc)) from None
        return data
