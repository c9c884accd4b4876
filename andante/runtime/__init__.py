"""Transport for the cluster layer (DESIGN.md §1): what runs `andante.cluster`'s pure
logic on real threads and processes.

`worker` (an engine stepped by one thread, with the instance's one thread-safe inbox),
`local` (in-process instances, the embedded default), `ray_actors` (one Ray actor per
instance, optional extra) and `clock` (wall time shared across processes).
"""
