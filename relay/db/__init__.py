"""The relay's database layer: URL resolution, embedded server, migrations, pool."""
