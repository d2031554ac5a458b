"""POST /api/v1/signing-secret/rotate: a new secret to sign the tenant's HTTP calls.

The answer is the only place the new secret is ever shown (`Cache-Control: no-store`, so
no cache between keeps it either); no other answer carries a tenant's secrets.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import tenant_services
from runs.api.fields import UtcDateTimeField


class SigningSecretSerializer(serializers.Serializer):
    secret = serializers.CharField(
        help_text="The new signing secret (whsec_...): store it now, it is never shown again."
    )
    previous_valid_until = UtcDateTimeField(
        help_text="Until then the previous secret signs every call too (a second signature in "
        "webhook-signature); after it, only the new one does."
    )


class SigningSecretRotateView(APIView):
    @extend_schema(
        summary="Rotate the signing secret of the tenant's HTTP calls",
        description="Every HTTP call carries webhook-id, webhook-timestamp and webhook-signature (the "
        "Standard Webhooks convention). This makes a new secret and answers it once; the previous one "
        "keeps signing beside it until previous_valid_until (SIGNING_SECRET_OVERLAP_SECONDS, 24 h by "
        "default). A rotation during an overlap ends that overlap: only the two newest secrets sign.",
        request=None,
        responses={200: SigningSecretSerializer},
    )
    def post(self, request: Request) -> Response:
        secret, until = tenant_services.rotate_signing_secret(tenant=request.auth, actor=request.user.actor)
        response = Response(SigningSecretSerializer({"secret": secret, "previous_valid_until": until}).data)
        response["Cache-Control"] = "no-store"
        return response
