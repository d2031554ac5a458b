"""GET /api/v1/forecast: the tenant's due runs per step of a window, from the schedules
(jobs/forecast.py)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import forecast
from runs.keys import format_utc
from scheduler_project import db

from .serializers import ForecastQuerySerializer, ForecastSerializer


def forecast_json(result: forecast.Forecast) -> dict:
    win = result.window
    return {
        "from": format_utc(win.start),
        "to": format_utc(win.end),
        "step": win.step_seconds,
        "total": result.total,
        "counts": result.counts,
        "spikes": [
            {
                "at": format_utc(spike.at),
                "index": spike.index,
                "count": spike.count,
                "times_mean": spike.times_mean,
                "causes": [
                    {
                        "kind": cause.kind,
                        "cron": cause.cron,
                        "interval_seconds": cause.interval_seconds,
                        "jobs": cause.jobs,
                        "runs": cause.runs,
                        "timezones": cause.timezones,
                        "spread": None
                        if cause.spread is None
                        else {"suggestion": cause.spread.suggestion, "why": cause.spread.why},
                    }
                    for cause in spike.causes
                ],
                "other_runs": spike.other_runs,
                "repeats": spike.repeats,
            }
            for spike in result.spikes
        ],
    }


class ForecastView(APIView):
    @extend_schema(
        summary="Runs due per step of a window, from the schedules",
        description=(
            "How many runs the tenant's jobs will have due in each step of [from, to), computed from "
            "their schedules (zone, DST policy, H, start_at/end_at; paused jobs have none), counted at "
            "their slots. Default: the next 24 h by minute. The spikes name the schedules behind them "
            "and whether H would spread them. The window spans at most 7 days and 10,080 steps."
        ),
        parameters=[
            OpenApiParameter(
                "from", OpenApiTypes.DATETIME, description="Inclusive; default now (step start)."
            ),
            OpenApiParameter("to", OpenApiTypes.DATETIME, description="Exclusive; default 24 h after from."),
            OpenApiParameter("step", int, description="Seconds per step; default 60."),
        ],
        responses=ForecastSerializer,
    )
    def get(self, request: Request) -> Response:
        query = ForecastQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        # JobInvalid naming from / to / step: a field-level 400 (jobs/api/errors.py).
        win = forecast.window(
            start=params.get("from"), end=params.get("to"), step_seconds=params.get("step"), now=db.now()
        )
        return Response(forecast_json(forecast.compute(window=win, tenant_id=request.auth.id)))
