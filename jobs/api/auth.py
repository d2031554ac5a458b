"""Bearer-token auth: a token belongs to one tenant; request.auth is that tenant."""

from __future__ import annotations

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from jobs import audit
from jobs.models import ApiToken, Tenant
from jobs.tenant_services import hash_token


class TenantTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != self.keyword.lower() or not token.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <token>'.")
        row = (
            ApiToken.objects.select_related("tenant")
            .filter(token_hash=hash_token(token.strip()), revoked=False)
            .first()
        )
        if row is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        # Coarse last-used stamp: one write per token per minute at most.
        now = timezone.now()
        if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        return (TenantUser(row.tenant, token_prefix=row.prefix), row.tenant)

    def authenticate_header(self, request) -> str:
        return self.keyword


class TenantUser:
    """Stands in for request.user on API requests; the tenant is what matters."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, tenant: Tenant, *, token_prefix: str = ""):
        self.tenant = tenant
        # Which of the tenant's tokens made the request: the audit log's "who".
        self.token_prefix = token_prefix

    @property
    def actor(self) -> str:
        return audit.tenant_actor(slug=self.tenant.slug, token_prefix=self.token_prefix)

    def __str__(self) -> str:
        return f"tenant:{self.tenant.slug}"


class IsTenant(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Tenant)
