"""Django's PostgreSQL backend whose *test* databases are Citus databases.

Selected by settings.py only when CRONYARD_CITUS_WORKERS lists the workers
(`make test-citus` sets it). Everything at run time is the stock backend; only test
database creation differs: Citus does not propagate CREATE DATABASE, so after Django
creates the coordinator's copy (and before it runs `migrate`, whose last migration
distributes the tables) the same database is created on every worker, with the
extension everywhere and the workers registered in the coordinator's copy.
"""

from __future__ import annotations

import os

from django.db.backends.postgresql import base, creation

from scheduler_project.citus import drop_database, parse_workers, prepare_database

WORKERS_ENV = "CRONYARD_CITUS_WORKERS"


def _workers() -> list[str]:
    return parse_workers(os.environ.get(WORKERS_ENV, ""))


class DatabaseCreation(creation.DatabaseCreation):
    def _coordinator(self) -> str:
        settings = self.connection.settings_dict
        return f"{settings['HOST'] or '127.0.0.1'}:{settings['PORT'] or 5432}"

    def _create_test_db(self, verbosity, autoclobber, keepdb=False):
        if not keepdb:
            # A leftover copy cannot be dropped by Django's plain DROP DATABASE (Citus's
            # maintenance daemon is connected to it): drop it here, forcibly.
            self._drop_everywhere(self._get_test_db_name())
        name = super()._create_test_db(verbosity, autoclobber, keepdb)
        settings = self.connection.settings_dict
        prepare_database(
            coordinator=self._coordinator(),
            workers=_workers(),
            db=name,
            user=settings["USER"],
            # Django just created the coordinator's copy; stale worker copies go.
            create_on_coordinator=False,
        )
        return name

    def _destroy_test_db(self, test_database_name, verbosity):
        self._drop_everywhere(test_database_name)

    def _drop_everywhere(self, name: str) -> None:
        user = self.connection.settings_dict["USER"]
        drop_database(nodes=[self._coordinator(), *_workers()], db=name, user=user)


class DatabaseWrapper(base.DatabaseWrapper):
    creation_class = DatabaseCreation
