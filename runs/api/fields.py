"""The one datetime field of both APIs: RFC 3339 in with any offset, UTC with Z out."""

from __future__ import annotations

from datetime import datetime

from rest_framework import serializers

from runs.keys import format_utc


class UtcDateTimeField(serializers.DateTimeField):
    """Accepts RFC 3339 with any offset (a zone is required); renders UTC with a Z."""

    default_error_messages = {
        "naive": "Include a UTC offset or Z, e.g. 2026-03-08T07:00:00Z.",
        "invalid": "Not an RFC 3339 timestamp; use e.g. 2026-03-08T07:00:00Z.",
    }

    def to_internal_value(self, value):
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value.strip().replace("z", "Z").replace("Z", "+00:00"))
            except ValueError:
                self.fail("invalid")
            if parsed.tzinfo is None:
                self.fail("naive")
        elif not isinstance(value, datetime):
            self.fail("invalid")
        return super().to_internal_value(value)

    def to_representation(self, value):
        return None if value is None else format_utc(value)
