"""Alembic environment for moetune's schema.

moetune.db.schema hands over an open connection (config.attributes["connection"]) already inside the
transaction and lock it wants. Run by hand (`alembic -c db/migrations/alembic.ini ...`), the database
is `sqlalchemy.url` from the ini, else $MOETUNE_DB, else the default SQLite file.
"""

from alembic import context

from moetune.db import models, urls
from moetune.db.engine import make_engine
from moetune.db.schema import VERSION_TABLE

config = context.config
# Only `alembic revision --autogenerate` compares against today's models; the version files never
# import them.
options = {
    "target_metadata": models.Base.metadata,
    "version_table": VERSION_TABLE,
    "render_as_batch": True,  # SQLite changes most columns only by rebuilding the table
}


def run_offline() -> None:
    context.configure(
        url=urls.resolve(config.get_main_option("sqlalchemy.url")), literal_binds=True, **options
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, **options)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = urls.parse(urls.resolve(config.get_main_option("sqlalchemy.url")))
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context.configure(connection=connection, **options)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
