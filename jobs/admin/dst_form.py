"""The job form's DST policy: two menus (a wall time that happens twice / one that does
not exist) instead of a JSON textarea, writing the same stored `dst_policy` object.

An unset menu leaves its key out, which keeps Debian cron's rule for the job's kind
(jobs/schedule/dst.py), exactly as an omitted key does in the API.
"""

from __future__ import annotations

from collections.abc import Mapping

from django import forms

from jobs.schedule import DST_MISSING, DST_REPEATED

KEYS = ("repeated", "missing")
_DEFAULT = ("", "cron's rule for this schedule")
_LABELS = {
    "first": "the first time",
    "last": "the second time",
    "both": "both times",
    "shift": "just after the gap",
    "skip": "not at all (skipped)",
}
REPEATED_CHOICES = [_DEFAULT, *[(v, _LABELS[v]) for v in DST_REPEATED]]
MISSING_CHOICES = [_DEFAULT, *[(v, _LABELS[v]) for v in DST_MISSING]]
# What each menu is about, shown beside it (the widget's template).
PROMPTS = ("A wall time that happens twice (fall back) runs", "One that does not exist (spring forward) runs")


class DstPolicyMenusWidget(forms.MultiWidget):
    template_name = "jobs/widgets/dst_policy.html"

    def __init__(self, attrs=None):
        super().__init__(
            {
                "repeated": forms.Select(choices=REPEATED_CHOICES),
                "missing": forms.Select(choices=MISSING_CHOICES),
            },
            attrs,
        )

    def decompress(self, value):
        value = value if isinstance(value, Mapping) else {}
        return [value.get(key) or "" for key in KEYS]

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        context["widget"]["rows"] = list(zip(PROMPTS, context["widget"]["subwidgets"], strict=True))
        return context


class DstPolicyMenusField(forms.MultiValueField):
    """{"repeated": ..., "missing": ...} with the unset menus left out ({} for neither)."""

    widget = DstPolicyMenusWidget

    def __init__(self, **kwargs):
        # The model field's JSON encoder/decoder do not apply to two menus.
        kwargs.pop("encoder", None)
        kwargs.pop("decoder", None)
        kwargs.pop("max_length", None)
        super().__init__(
            fields=(
                forms.ChoiceField(choices=REPEATED_CHOICES, required=False),
                forms.ChoiceField(choices=MISSING_CHOICES, required=False),
            ),
            require_all_fields=False,
            **{**kwargs, "required": False},
        )

    def compress(self, data_list):
        return {key: value for key, value in zip(KEYS, data_list or ("", ""), strict=False) if value}
