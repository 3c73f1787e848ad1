"""What one relay process runs beside its routes: configuration and in-memory state, the
live change hub and its LISTEN connection, group commit of pushes, the scan gate, the
password-hashing pool, background maintenance and the metrics. No HTTP here."""
