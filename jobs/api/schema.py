"""OpenAPI description of the tenant token auth (drf-spectacular cannot infer a custom class)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class TenantTokenScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.api.auth.TenantTokenAuthentication"
    name = "tenantToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Tenant API token (manage.py create_tenant).",
        }
