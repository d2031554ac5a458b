"""JSON fields that do not coerce: "60" is not an integer, "yes" is not a boolean.

DRF's defaults accept strings for numbers and booleans (form-friendly); a JSON API
that silently turns `"interval_seconds": "60s"`-style mistakes into something else
hides client bugs, so JSON bodies get these.
"""

from __future__ import annotations

from datetime import datetime

from rest_framework import serializers

from runs.keys import format_utc


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required (a JSON number, not a string)."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if isinstance(data, float) and not data.is_integer():
            self.fail("invalid")
        return super().to_internal_value(int(data))


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


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
