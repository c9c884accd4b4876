"""Paper reproductions (one module per evaluation), run as `andante experiment NAME`.

They are not product code: they use the simulator, the load generator and the report
writer of `andante` as any user script would.
"""
