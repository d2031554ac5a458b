"""GET /api/v1/tasks/: the task registry a `{"type": "task"}` target may name."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from runs import tasks


class TaskSerializer(serializers.Serializer):
    name = serializers.CharField(help_text='What a target\'s "name" must be.')
    doc = serializers.CharField(help_text="The task's docstring.")
    schema = serializers.DictField(
        help_text="JSON Schema of the target's kwargs (derived from the task's signature unless declared); "
        "kwargs that do not fit are a 400 naming target.kwargs.<field>."
    )
    is_async = serializers.BooleanField(help_text="Async: cancelled on timeout; sync: abandoned.")


class TaskListView(APIView):
    @extend_schema(
        summary="Registered tasks a task target may name",
        description="The registry of EXECUTOR_TASK_MODULES, as this web process loaded it; executors must "
        "load the same modules. Sorted by name.",
        responses=TaskSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        return Response(TaskSerializer(tasks.catalog(), many=True).data)
