"""JSON fields that do not coerce: "60" is not an integer, "yes" is not a boolean.

DRF's defaults accept strings for numbers and booleans (form-friendly); a JSON API
that silently turns `"interval_seconds": "60s"`-style mistakes into something else
hides client bugs, so JSON bodies get these. JSON-valued fields decode form-posted
text within the same nesting bound as a JSON body.
"""

from __future__ import annotations

from rest_framework import serializers

from jobs.rules import nesting
from runs.api.fields import UtcDateTimeField  # noqa: F401 - one UTC field for both APIs


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


class BoundedJSONField(serializers.JSONField):
    """A JSON field whose text a form post carries is decoded within jobs.rules.nesting's bound
    (a JSON body was bounded by the parser already)."""

    def to_internal_value(self, data):
        if getattr(data, "is_json_string", False):  # DRF's mark on a form field's text
            try:
                return nesting.loads(data)
            except nesting.TooDeep as exc:
                raise serializers.ValidationError(str(exc)) from None
            except ValueError:
                self.fail("invalid")
        return super().to_internal_value(data)
