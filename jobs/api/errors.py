"""Every API error is JSON; validation errors are `{"field": ["message"]}`
(docs/CONTRACT.md, "REST API")."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from jobs.rules.job import JobInvalid
from jobs.schedule import ScheduleError
from jobs.services import ServiceError

from .serializers import api_errors

log = logging.getLogger(__name__)


def exception_handler(exc, context):
    if isinstance(exc, RequestDataTooBig):
        # Django's own text names its setting (DATA_UPLOAD_MAX_MEMORY_SIZE), which means
        # nothing to an API client: say the limit in bytes, with the status that means it.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"Request body too large: the limit is {limit} bytes.", "limit_bytes": limit},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, JobInvalid):
        # The service judged the merged job: model field names, renamed for the API.
        return Response(api_errors(exc.errors), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ServiceError):
        return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ScheduleError):
        return Response({"schedule": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, (DataError, IntegrityError)):
        # The serializers should have caught it; answer 400 rather than 500 and log the gap.
        log.warning("database rejected a request: %s", exc)
        return Response({"non_field_errors": [str(exc).splitlines()[0]]}, status=status.HTTP_400_BAD_REQUEST)
    return drf_handler(exc, context)
