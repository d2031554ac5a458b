"""Django's PostgreSQL backend, plus test databases that exist on every Citus node (base.py)."""
