"""The `andante` command line."""
