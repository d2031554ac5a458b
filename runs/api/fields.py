"""What both APIs share: the datetime field (RFC 3339 in with any offset, UTC with Z out)
and the refusal of unknown body fields."""

from __future__ import annotations

from datetime import datetime

from rest_framework import serializers

from runs.keys import NaiveTimestamp, format_utc, parse_rfc3339


class UtcDateTimeField(serializers.DateTimeField):
    """Accepts RFC 3339 with any offset (a zone is required); renders UTC with a Z."""

    default_error_messages = {
        "naive": "Include a UTC offset or Z, e.g. 2026-03-08T07:00:00Z.",
        "invalid": "Not an RFC 3339 timestamp; use e.g. 2026-03-08T07:00:00Z.",
    }

    def to_internal_value(self, value):
        if isinstance(value, str):
            # The same reading as run keys and cursors (runs.keys); DRF then parses the
            # string itself, so its own range checks still apply.
            try:
                parse_rfc3339(value)
            except NaiveTimestamp:
                self.fail("naive")
            except ValueError:
                self.fail("invalid")
        elif not isinstance(value, datetime):
            self.fail("invalid")
        return super().to_internal_value(value)

    def to_representation(self, value):
        return None if value is None else format_utc(value)


class RejectUnknownMixin:
    """A typo such as `intervall_seconds` must be a 400, not a silently different request."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)
